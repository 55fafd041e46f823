"""Layer 2, measure: the vocabulary of a measurement, pure.

Load specs and goals (``specs``), latency histograms (``histograms``), the records of what was
measured (``measurement``), stability and the slacks against the goals (``goals``), the capacity
search and its result (``capacity``), sample counts and the gain interval (``gain``), the
``LoadGenerator`` seam and the load output document (``generator``), and the sequential p99
verdict of one load step (``stepping``). Imports only ``errors`` and ``documents``.
"""
