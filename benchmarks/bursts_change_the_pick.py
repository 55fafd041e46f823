"""Bursts change the pick, measured: one ``perfsweep run`` under Poisson arrivals and short bursts
on the reference server's simulated device, beside the simulator's prediction of the same.

The device and the two configs of ``tests/predict/test_bursts_change_the_pick.py``: 5 ms host,
10 ms + 1 ms an item on the device (serialised across instances), 5 ms host; ``max_batch_size``
16 on two instances with no queue delay and with 8 ms; goal p99 <= 45 ms; the bursts
``mmpp:20@0.005,0.2@0.1`` (20x the mean rate for 5 ms, a fifth of it for 100 ms). The run lists
both shapes (``traffic.arrival``), so each config's capacity is searched under both in one run;
the table sets the measured capacities beside the simulator's. Under the bursts the capacities
are 15-40 req/s, so each search takes minutes: this is a benchmark, not a test.

Usage::

    .venv/bin/python benchmarks/bursts_change_the_pick.py          # ~27 min here

It prints a markdown table and writes ``benchmarks/results/bursts_change_the_pick-<UTC>.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.measure.arrivals import POISSON, parse_arrival  # noqa: E402
from analyzer.predict.capacity import capacity  # noqa: E402
from analyzer.predict.profile import BatchTiming, Profile  # noqa: E402
from analyzer.predict.sim_records import SimConfig  # noqa: E402
from analyzer.rundir import records  # noqa: E402
from analyzer.rundir.measurements import ShapesMeasurement  # noqa: E402

BURSTS = "mmpp:20@0.005,0.2@0.1"
GOAL_MS = 45.0

PROFILE_TOML = """\
name = "bursty"
provenance = "SYNTHETIC: 5 ms host, 10 ms + 1 ms an item on the device, 5 ms host"
seed = 0
jitter = 0.0
[device]
a_ms = 10.0
b_ms = 1.0
[host_pre]
a_ms = 5.0
[host_post]
a_ms = 5.0
"""

CONFIG = """\
name: "bursty"
backend: "simulated"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters { key: "profile" value: { string_value: "profile.toml" } }
dynamic_batching { }
"""

SCENARIO = f"""\
objective = "throughput"
[model]
name = "bursty"
[traffic]
arrival = ["poisson", "{BURSTS}"]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 1000.0
[goals]
p99_ms = {GOAL_MS}
[space]
max_batch_size = [16, 16]
max_queue_delay_us = [0, 8000]
delay_steps = 2
preferred_batch_size = "none"
instance_count = [2, 2]
[budget]
trials = 2
warmup_s = 0.5
window_s = 1.0
min_requests = 200
capacity_resolution = 0.15
validate_top = 0
[search]
strategy = "grid"
"""

SIM_PROFILE = Profile(
    model="bursty",
    provenance="the profile above",
    source="benchmark",
    timings=tuple(BatchTiming(b, 5.0, 10.0 + b, 5.0) for b in range(1, 17)),
)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bursts-"))
    model = work / "repo" / "bursty"
    (model / "1").mkdir(parents=True)
    (model / "profile.toml").write_text(PROFILE_TOML)
    (model / "config.pbtxt").write_text(CONFIG)
    (work / "scenario.toml").write_text(SCENARIO)
    cmd = [
        str(Path(sys.executable).with_name("perfsweep")),
        "run",
        "--scenario",
        str(work / "scenario.toml"),
        "--model-repository",
        str(work / "repo"),
        "--model",
        "bursty",
        "--device",
        "sim",
        "--run-dir",
        str(work / "run"),
    ]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        return done.returncode
    rows = []
    for path in sorted((work / "run" / "trials").glob("*/measurement.json")):
        trial = records.load_trial(path)
        assert isinstance(trial.measurement, ShapesMeasurement)
        measured = trial.measurement.capacities()
        sim = SimConfig(16, trial.config.max_queue_delay_us, (), 2)
        predicted = {
            text: capacity(SIM_PROFILE, sim, GOAL_MS, requests=3000, arrival=arrival).capacity_rps
            for text, arrival in (("poisson", POISSON), (BURSTS, parse_arrival(BURSTS)))
        }
        rows.append(
            {
                "trial": trial.number,
                "max_queue_delay_us": trial.config.max_queue_delay_us,
                "measured_rps": measured,
                "predicted_rps": predicted,
            }
        )
    by_delay = {r["max_queue_delay_us"]: r for r in rows}
    poisson_pick = max(by_delay, key=lambda d: by_delay[d]["measured_rps"]["poisson"])
    burst_pick = max(by_delay, key=lambda d: by_delay[d]["measured_rps"][BURSTS])
    kept = (
        by_delay[poisson_pick]["measured_rps"][BURSTS]
        / by_delay[burst_pick]["measured_rps"][BURSTS]
    )
    print(
        "| delay | Poisson, measured | Poisson, simulated | bursts, measured | bursts, simulated |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        m, p = r["measured_rps"], r["predicted_rps"]
        print(
            f"| {r['max_queue_delay_us']} us | {m['poisson']:.0f} | {p['poisson']:.0f} | "
            f"{m[BURSTS]:.0f} | {p[BURSTS]:.0f} |"
        )
    print(
        f"\nPoisson pick: delay {poisson_pick} us; burst pick: delay {burst_pick} us; under the "
        f"bursts the Poisson pick serves {kept:.0%} of the burst pick's capacity; run {wall:.0f} s"
    )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = ROOT / "benchmarks" / "results" / f"bursts_change_the_pick-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "bursts_change_the_pick",
                "command": " ".join(cmd[1:]),
                "wall_s": wall,
                "goal_p99_ms": GOAL_MS,
                "bursts": BURSTS,
                "rows": rows,
                "poisson_pick_delay_us": poisson_pick,
                "burst_pick_delay_us": burst_pick,
                "poisson_pick_share_under_bursts": kept,
            },
            indent=1,
        )
    )
    print(f"written {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
