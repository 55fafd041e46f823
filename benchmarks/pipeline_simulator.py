"""The pipeline simulator's prediction error: an ensemble's capacity, predicted vs measured.

The pipeline: the bundled ``examples/pipeline`` (the ensemble ``pipe``: ``pre`` -> ``infer`` ->
``post``) on the reference server's simulated device, started as its own process.

1. Profile: the probe on each composing model, with that model's own inputs
   (``analyzer.predict.planner.probe_live``), as ``--search predict`` profiles one model.
2. Measure: for each config in :data:`CONFIGS` (every stage's knobs, loaded stage by stage), the
   ensemble's capacity at the goal with ``perfsweep load --find-capacity`` (``--resolution``).
3. Calibrate: the pipeline's latency offset (what no stage sees) from the first config's
   measured points (the baseline, as a sweep calibrates on its baseline): ``pipeline_offset``.
4. Predict: ``pipeline_capacity`` of each config; error = ``|predicted - measured| / measured``,
   over the configs after the first (the one the offset was fitted on is reported, not counted).

Beside it, the one-model figure: ``benchmarks/time_to_answer.py`` reports the prediction error of
the one-model simulator over a grid.

Command (repository root): ``.venv/bin/python benchmarks/pipeline_simulator.py``
(``--p99-ms 150 --max-rps 350 --resolution 0.05``; ``--limit N``: the first N configs). Loopback
only; the server is stopped at the end. Writes ``benchmarks/results/pipeline_simulator-*.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.config.knobs import Knobs  # noqa: E402
from analyzer.config.model_config import apply_knobs  # noqa: E402
from analyzer.measure.generator import read_load_output  # noqa: E402
from analyzer.predict.pipeline_sim import (  # noqa: E402
    PipelineProfile,
    pipeline_capacity,
    pipeline_offset,
)
from analyzer.predict.planner import probe_live  # noqa: E402
from analyzer.predict.sim_records import SimConfig  # noqa: E402
from analyzer.target.remote import RemoteTarget  # noqa: E402
from benchmarks.prediction_error import score  # noqa: E402
from benchmarks.prediction_error import table as error_table  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.support.servers import ReferenceProcess  # noqa: E402

FORMAT_VERSION = 1
CLI = (sys.executable, "-c", "from analyzer.cli import main; main()")
STAGES = ("pre", "infer", "post")
REPOSITORY = ROOT / "examples" / "pipeline"

#: Each config: the knobs of the stages it changes (the others keep the repository's config).
#: The first is the repository as it is (``infer`` without dynamic batching): the baseline.
CONFIGS: list[dict[str, Knobs]] = [
    {},
    {"infer": Knobs(4)},
    {"infer": Knobs(8)},
    {"infer": Knobs(16)},
    {"infer": Knobs(16, 4000)},
    {"infer": Knobs(16, 16000)},
    {"infer": Knobs(4, instance_count=2)},
    {"infer": Knobs(8, 4000, instance_count=2)},
    {"infer": Knobs(16, instance_count=2)},
    {"infer": Knobs(16, dynamic_batching=False, instance_count=2)},
    {"infer": Knobs(8, 2000), "pre": Knobs(16, dynamic_batching=False), "post": Knobs(4)},
    {"infer": Knobs(16, 8000), "pre": Knobs(16, instance_count=2), "post": Knobs(16, 2000)},
]


def _describe(knobs: dict[str, Knobs]) -> str:
    return "; ".join(f"{s}: {knobs[s].label()}" for s in STAGES if s in knobs) or "as found"


def _measure(
    args: argparse.Namespace, url: str, out: Path
) -> tuple[float, list[tuple[float, float]]]:
    """The ensemble's capacity at the goal, and every measured (rate, p99) point."""
    done = subprocess.run(
        [
            *CLI,
            *("load", "--url", url, "--model", "pipe", "--find-capacity"),
            *("--p99-ms", str(args.p99_ms), "--max-rps", str(args.max_rps)),
            *("--resolution", str(args.resolution), "--output", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"perfsweep load failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    measurements, capacity = read_load_output(json.loads(out.read_text()))
    points = [(m.target, m.p99_ms) for m in measurements if m.valid and m.error_count == 0]
    return (capacity.capacity_rps if capacity else 0.0), points


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    configs = CONFIGS[: args.limit] if args.limit else CONFIGS
    with ReferenceProcess(
        work / "server", repository=REPOSITORY, args=["--model=pipe"], device="sim"
    ) as server:
        url = server.http_url
        started = time.monotonic()
        profiles: list[tuple[str, Any]] = []
        originals = {}
        for stage in STAGES:
            profile, _ = probe_live(url, stage)
            profiles.append((stage, profile))
            originals[stage] = RemoteTarget(url, stage).model_config()
        probe_s = time.monotonic() - started
        rows: list[dict[str, Any]] = []
        for i, knobs in enumerate(configs):
            loaded = {
                s: apply_knobs(originals[s], knobs[s]) if s in knobs else originals[s]
                for s in STAGES
            }
            for stage in STAGES:
                target = RemoteTarget(url, stage)
                target.start()
                target.load_config(loaded[stage])
            print(f"[{i + 1}/{len(configs)}] {_describe(knobs)} ...", flush=True)
            capacity, points = _measure(args, url, work / f"capacity-{i}.json")
            rows.append(
                {
                    "config": _describe(knobs),
                    "sim": {s: SimConfig.from_model_config(loaded[s]) for s in STAGES},
                    "measured_rps": capacity,
                    "points": points,
                }
            )
            print(f"  measured {capacity:.1f} req/s", flush=True)
        for stage in STAGES:
            RemoteTarget(url, stage).load_config(originals[stage])
    pipeline = PipelineProfile(tuple(profiles))
    base = rows[0]
    offset = pipeline_offset(
        pipeline, [(base["sim"], rate, p99) for rate, p99 in base["points"] if p99 <= args.p99_ms]
    )
    calibrated = PipelineProfile(pipeline.stages, latency_offset_ms=offset or 0.0)
    scored = score(
        rows,
        lambda sims: (
            pipeline_capacity(calibrated, sims, args.p99_ms, ceiling_rps=args.max_rps).capacity_rps
        ),
    )
    return {
        "p99_ms": args.p99_ms,
        "max_rps": args.max_rps,
        "resolution": args.resolution,
        "probe_s": round(probe_s, 1),
        "latency_offset_ms": offset,
        **scored,
    }


def table(result: dict[str, Any]) -> str:
    return error_table(result, f"offset {result['latency_offset_ms']} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p99-ms", type=float, default=150.0)
    parser.add_argument("--max-rps", type=float, default=350.0)
    parser.add_argument("--resolution", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="only the first N configs")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    return run_recorded(
        "pipeline_simulator",
        FORMAT_VERSION,
        lambda work: run(args, work),
        table,
        output=args.output,
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
