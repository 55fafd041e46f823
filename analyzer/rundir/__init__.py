"""Layer 4, rundir: the run directory and the typed records in it.

Versioned records (summary, trials, validation) with their migrations (``records``) and the
run directory's layout, ``trials.csv`` and loaders (``results``). Imports ``config`` and the
layers below it.
"""
