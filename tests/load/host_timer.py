"""How late this host wakes a bare timer: the floor under any open-loop generator's send lag.

``python -m tests.load.host_timer RATE`` sleeps (``time.sleep``: an hrtimer) to each tick of a
constant RATE schedule until its stdin closes, then prints, as JSON, how many ticks there were and
the share that woke more than 1 ms late. It does nothing else, so its lateness is the host's
(other processes holding the cores), not any design's: a generator measured beside it is judged on
what it adds to that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from tests.load.child import REPO_ROOT


def main() -> None:
    """Child side: tick until stdin closes, then print the tally."""
    rate = float(sys.argv[1])
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    ticks = late = 0
    start = time.perf_counter()
    while not closed.is_set():
        due = start + ticks / rate
        if (remaining := due - time.perf_counter()) > 0:
            time.sleep(remaining)
        ticks += 1
        late += time.perf_counter() - due > 1e-3
    print(json.dumps({"ticks": ticks, "late_share_1ms": late / max(ticks, 1)}), flush=True)


class HostTimer:
    """``with HostTimer(rate) as host: ...`` ticks a bare timer beside the block; then
    ``host.late_share`` is the share of its ticks that woke over 1 ms late."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.ticks = 0
        self.late_share = 0.0

    def __enter__(self) -> HostTimer:
        self._child = subprocess.Popen(
            [sys.executable, "-m", "tests.load.host_timer", str(self.rate)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._child.communicate(input="", timeout=30)
        tally = json.loads(out.strip().splitlines()[-1])
        self.ticks, self.late_share = tally["ticks"], tally["late_share_1ms"]


if __name__ == "__main__":
    main()
