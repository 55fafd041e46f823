"""Layer 9 (with ``report``), gate: the CI performance gate.

Criteria, baseline comparison and the outputs CI reads (``verdict``, pure), and the gate's own
measurement, ``perfsweep gate`` as one library call (``run``). Imports ``search`` and ``predict``
and the layers below them.
"""
