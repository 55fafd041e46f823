"""Layer 8 (with ``predict``), search: which configs to measure.

The Optuna study, the only module that imports optuna (``study``), the space it searches
(``space``, optuna-free), and the ``--search`` strategies predict, tpe, random and grid
(``strategy``, which consults ``predict``). Imports ``evaluation`` and the layers below it.
"""
