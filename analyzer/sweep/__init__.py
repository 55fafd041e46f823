"""Layer 10, sweep: the sweep loop, end to end, and what ``best/config.pbtxt`` holds (``loop``).

Imports ``report``, ``gate`` and every layer below them; only ``commands`` and ``cli`` sit above.
"""
