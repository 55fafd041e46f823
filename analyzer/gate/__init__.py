"""Layer 9 (with ``report``), gate: the CI performance gate.

Criteria, baseline comparison and verdicts (``verdict``, pure), the rank test behind them
(``significance``), results read into a gate input (``inputs``), the outputs CI reads
(``render``), and ``perfsweep gate`` as one library call (``run``) with its criteria and plan
(``plan``) and its repeated measurement (``measuring``). Imports ``search`` and ``predict`` and
the layers below them.
"""
