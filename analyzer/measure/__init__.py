"""Layer 2, measure: the vocabulary of a measurement, pure.

Histograms, load specs, goals, measurement records and their stability, the capacity search,
the gain interval (``measurement``), and the sequential p99 verdict of one load step
(``stepping``). Imports only ``errors`` and ``documents``.
"""
