"""Layer 9 (with ``report``), gate: the CI performance gate.

Criteria, baseline comparison and the outputs CI reads (``verdict``, pure), and the gate's own
measurement, ``perfsweep gate`` as one library call (``run``); results are read by ``inputs``,
the rank test is ``significance``, the outputs ``render``. Imports ``search`` and ``predict``
and the layers below them.
"""
