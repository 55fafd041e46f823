"""Measuring one loaded config, split by job::

    plan.py       LoadPlan: the load specs of search and validation, warm-up, the fixed level
                  (pure: from the scenario alone)
    capacity.py   CapacityDriver: one capacity search for open and closed loop, behind the
                  LoadGenerator seam
    slack.py      slacks(): numbers -> constraints (pure)
    evaluator.py  Evaluator: asks the objective what to measure; returns an Evaluation

No optuna or gevent here (the load generator is passed in).

Layer 7 of ``analyzer`` (``docs/internals.md``): imports ``load`` and the layers below it
(in practice ``rundir``, ``config`` and ``measure``).
"""

from analyzer.evaluation.capacity import CapacityDriver
from analyzer.evaluation.evaluator import (
    Evaluation,
    Evaluator,
    capacity_numbers,
    level_numbers,
    peak_gpu_memory_mb,
)
from analyzer.evaluation.plan import Expected, LoadPlan
from analyzer.evaluation.slack import slacks

__all__ = [
    "CapacityDriver",
    "Evaluation",
    "Evaluator",
    "Expected",
    "LoadPlan",
    "capacity_numbers",
    "level_numbers",
    "peak_gpu_memory_mb",
    "slacks",
]
