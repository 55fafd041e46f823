"""The small sweep that end-to-end tests run against a real server: a scenario whose whole run
(baseline, a few tpe trials, one validation check) takes well under a minute."""

from __future__ import annotations

import sys

#: ``perfsweep`` as a child process, from this interpreter.
CLI = (sys.executable, "-c", "from analyzer.cli import main; main()")

_SMALL = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = {max_rate_rps}
[goals]
p99_ms = {p99_ms}
max_error_rate = 0.01
[space]
max_batch_size = [1, 8]
max_queue_delay_us = [0, 2000]
delay_steps = 2
instance_count = [1, 2]
[budget]
trials = {trials}
warmup_s = 0.5
window_s = 0.5
min_requests = 60
capacity_resolution = 0.3
validate_top = {validate_top}
validate_repeats = 1
validate_window_factor = 1.0
[search]
strategy = "tpe"
"""


def small_scenario(
    trials: int = 2,
    max_rate_rps: float = 300.0,
    p99_ms: float = 300.0,
    model: str | None = None,
    validate_top: int = 1,
) -> str:
    """The small sweep's scenario TOML (``model``: a ``[model] name``, else the command's;
    ``validate_top`` 0: no validation phase, for tests that assert nothing of it)."""
    text = _SMALL.format(
        trials=trials, max_rate_rps=max_rate_rps, p99_ms=p99_ms, validate_top=validate_top
    )
    return f'{text}[model]\nname = "{model}"\n' if model else text
