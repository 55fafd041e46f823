"""perfsweep: find the dynamic-batching config that serves the most traffic within a latency goal."""

__version__ = "0.1.0"
