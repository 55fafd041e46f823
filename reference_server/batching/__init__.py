"""Batch formation and execution: the pure dynamic-batcher step (``decide``), the threaded
per-model ``scheduler`` that applies it, and the model ``instances`` that run the batches on
their (real or simulated) devices.
"""
