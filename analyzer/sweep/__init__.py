"""Layer 10, sweep: the sweep, end to end.

The loop (``loop``: ``run_sweep``, set-up, ask/tell), what its phases share (``state``), one
trial (``trials``), the profile phase (``predictions``), validation (``validation``), and the
finish: winner, what ``best/config.pbtxt`` holds, the report (``finish``). Imports ``report``,
``gate`` and every layer below them; only ``commands`` and ``cli`` sit above.
"""
