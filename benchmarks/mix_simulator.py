"""The mix simulator's prediction error: a mix of models' capacity, predicted vs measured.

The mix: the mix benchmarks' three models (benchmarks/mixes.py ``THREE``: ``rank``, ``tag`` and
``embed``, 3:4:2, each held to its own p99: 400, 40 and 120 ms) on the reference server's
simulated device (``--device sim``: every instance of every model shares it), started as its own
process.

1. Profile: the probe on each model (``analyzer.predict.planner.probe_live``), as
   ``--search predict`` profiles a mix's models.
2. Measure: for each config set in :data:`CONFIGS` (each model's knobs, loaded model by model),
   the mix's capacity (the largest rate of the whole mix at which every model meets its own
   goal) with ``perfsweep load --mix rank=3@400,tag=4@40,embed=2@120 --find-capacity``.
3. Calibrate: each model's latency offset from the first config's measured points where every
   model met its goal (the baseline, as a sweep calibrates on its baseline): ``mix_offsets``.
4. Predict: ``mix_capacity`` of each config set; error = ``|predicted - measured| / measured``,
   over the configs after the first (the one the offsets were fitted on is reported, not
   counted).

Beside it: the one-model figure (``benchmarks/time_to_answer.py``) and the pipeline's
(``benchmarks/pipeline_simulator.py``).

Command (repository root): ``.venv/bin/python benchmarks/mix_simulator.py``
(``--max-rps 1000 --resolution 0.05``; ``--limit N``: the first N configs). Loopback only; the
server is stopped at the end. Writes ``benchmarks/results/mix_simulator-*.json``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.config.knobs import Knobs  # noqa: E402
from analyzer.config.model_config import apply_knobs  # noqa: E402
from analyzer.measure.generator import read_load_output  # noqa: E402
from analyzer.predict.mix_sim import MixModel, MixProfile, mix_capacity, mix_offsets  # noqa: E402
from analyzer.predict.planner import probe_live  # noqa: E402
from analyzer.predict.sim_records import SimConfig  # noqa: E402
from analyzer.target.remote import RemoteTarget  # noqa: E402
from benchmarks.mixes import THREE, SimServer, mix_flag  # noqa: E402
from benchmarks.prediction_error import score  # noqa: E402
from benchmarks.prediction_error import table as error_table  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.support.servers import ReferenceProcess  # noqa: E402
from tests.support.sweeps import load  # noqa: E402

FORMAT_VERSION = 1
MODELS = tuple(THREE)

#: Each config set: the knobs of the models it changes (the others keep the repository's
#: config: unbatched, one instance). The first is the repository as it is: the baseline.
CONFIGS: list[dict[str, Knobs]] = [
    {},
    {m: Knobs(8) for m in MODELS},
    {m: Knobs(16) for m in MODELS},
    {m: Knobs(32) for m in MODELS},
    # Each model's best alone (benchmarks/mix_solo_vs_joint.py), and the mix's together.
    {"rank": Knobs(32, instance_count=2), "tag": Knobs(4), "embed": Knobs(16)},
    {"rank": Knobs(8, 0, (8, 4)), "tag": Knobs(32), "embed": Knobs(16)},
    {"rank": Knobs(16, 4000, instance_count=2), "tag": Knobs(8), "embed": Knobs(8)},
    {"rank": Knobs(32, 8000), "tag": Knobs(16, instance_count=2), "embed": Knobs(32)},
    {"rank": Knobs(4), "tag": Knobs(32, 2000), "embed": Knobs(4, instance_count=2)},
    {"rank": Knobs(16), "tag": Knobs(1, dynamic_batching=False, instance_count=2)},
    {m: Knobs(8, instance_count=2) for m in MODELS},
    {m: Knobs(32, 4000) for m in MODELS},
]


def _describe(knobs: dict[str, Knobs]) -> str:
    return "; ".join(f"{m}: {knobs[m].label()}" for m in MODELS if m in knobs) or "as found"


def _measure(
    args: argparse.Namespace, url: str, out: Path
) -> tuple[float, list[tuple[float, dict[str, float]]]]:
    """The mix's capacity, and every measured (rate, each model's p99) where every model met
    its goal."""
    doc = load(
        url,
        out,
        *("--mix", mix_flag(THREE), "--find-capacity", "--max-rps", str(args.max_rps)),
        *("--resolution", str(args.resolution)),
    )
    measurements, capacity = read_load_output(doc)
    points = []
    for m in measurements:
        p99s = {c.model: c.p99_ms for c in m.classes if c.model}
        met = all(p99s.get(name, float("inf")) <= spec.p99_ms for name, spec in THREE.items())
        if m.valid and m.error_count == 0 and met:
            points.append((m.target, p99s))
    return (capacity.capacity_rps if capacity else 0.0), points


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    configs = CONFIGS[: args.limit] if args.limit else CONFIGS
    repo = SimServer().write(work / "repo", THREE)
    with ReferenceProcess(
        work / "server", repository=repo, args=[f"--model={m}" for m in MODELS], device="sim"
    ) as server:
        url = server.http_url
        started = time.monotonic()
        profiles = {}
        originals = {}
        for model in MODELS:
            profiles[model], _ = probe_live(url, model)
            originals[model] = RemoteTarget(url, model).model_config()
        probe_s = time.monotonic() - started
        rows: list[dict[str, Any]] = []
        for i, knobs in enumerate(configs):
            loaded = {
                m: apply_knobs(originals[m], knobs[m]) if m in knobs else originals[m]
                for m in MODELS
            }
            for model in MODELS:
                target = RemoteTarget(url, model)
                target.start()
                target.load_config(loaded[model])
            print(f"[{i + 1}/{len(configs)}] {_describe(knobs)} ...", flush=True)
            capacity, points = _measure(args, url, work / f"capacity-{i}.json")
            rows.append(
                {
                    "config": _describe(knobs),
                    "sim": {m: SimConfig.from_model_config(loaded[m]) for m in MODELS},
                    "measured_rps": capacity,
                    "points": points,
                }
            )
            print(f"  measured {capacity:.1f} req/s", flush=True)
    mix = MixProfile(
        tuple(MixModel(m, profiles[m], spec.share, spec.p99_ms) for m, spec in THREE.items())
    )
    base = rows[0]
    calibrated = mix_offsets(mix, [(base["sim"], rate, p99s) for rate, p99s in base["points"]])
    scored = score(
        rows, lambda sims: mix_capacity(calibrated, sims, ceiling_rps=args.max_rps).capacity_rps
    )
    return {
        "mix": mix_flag(THREE),
        "max_rps": args.max_rps,
        "resolution": args.resolution,
        "probe_s": round(probe_s, 1),
        "latency_offsets_ms": {m.name: m.profile.latency_offset_ms for m in calibrated.models},
        **scored,
    }


def table(result: dict[str, Any]) -> str:
    return error_table(result, f"offsets {result['latency_offsets_ms']} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rps", type=float, default=1000.0)
    parser.add_argument("--resolution", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="only the first N configs")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    return run_recorded(
        "mix_simulator", FORMAT_VERSION, lambda work: run(args, work), table, output=args.output
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
