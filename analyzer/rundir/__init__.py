"""Layer 4, rundir: the run directory and the typed records in it.

Versioned records, one module per kind (``summary``, ``trial_record``, ``validation``,
``predictions``, ``measurements``, on ``parsing``), read and written by ``records``, and the
run directory's layout, ``trials.csv`` and loaders (``results``). Imports ``config`` and the
layers below it.
"""
