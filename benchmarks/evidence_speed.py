"""Answers at the speed of the evidence: a variable-length model whose instances share one device,
before and after, on a real Triton, in one run.

The model: a Python-backend text classifier on a real Triton 2.51 (nvidia-pytriton's
``tritonserver``), INT64 ``[-1]`` token ids and mask (:mod:`tests.support.text_model`). Each
execution sleeps ``HOST_MS`` per request outside a lock (host work, which overlaps across
instances), then ``BASE_MS + PER_TOKEN_MS x rows x longest sentence`` holding an exclusive
``flock`` on one file every instance opens: one device the instances queue for. Its own config:
one instance, no dynamic batching, no ``allow_ragged_batch`` (Triton batches equal shapes only).
The data: 8 sentences of 12 to 200 tokens in random order (a perf_analyzer data file).

Each row is one ``perfsweep run --url ... --model textcls --input-data data.json --p99-ms 80``
(what a new user types; the scenario's defaults otherwise), by two perfsweeps:

* ``before``: commit ``--before`` (default :data:`BEFORE_COMMIT`), from a ``git archive`` of it;
* ``after``: this working tree;

and three ways: ``plain``; ``ragged`` (``--ragged-batch search``); ``buckets``
(``--pad-buckets auto --pad-values INPUT_IDS=0,ATTENTION_MASK=0``). The model's own config is
loaded back before every row. Recorded per row: wall time (the ``perfsweep run`` process),
time per phase (``summary.json``'s ``phases``), trials and what stopped the run, the answer and
its capacity (the run's own, validated where the run validates; ``--measure-answers`` also
measures it by ``perfsweep load --find-capacity`` with the answer loaded), the validation share
of wall time, and the predicted-vs-measured error of every measured config (the baseline
included: each trial record's prediction against its measured capacity).

The claims (``claims``), after against before: the plain run in at most half the time; the same
capacity within the capacity search's resolution (10 %); validation at most a quarter of every
after row's wall time; every after prediction within 20 % of its measurement.

Usage (repository root; about 30 min for all six rows on a quiet machine)::

    .venv/bin/python benchmarks/evidence_speed.py
    .venv/bin/python benchmarks/evidence_speed.py --ways plain --sides after

It prints a markdown table and writes ``benchmarks/results/evidence_speed-<UTC>.json``
(``format_version`` 1).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import run_recorded  # noqa: E402
from tests.support.real_triton import RealTriton, TritonInstall  # noqa: E402
from tests.support.sweeps import CLI  # noqa: E402
from tests.support.text_model import padded_sequence_model, write_data_file  # noqa: E402

#: main before steps sized by their evidence, validation by its doubt and predictions bounded by
#: a shared device.
BEFORE_COMMIT = "648c8c9"
MODEL = "textcls"
HOST_MS = 3.0
BASE_MS = 1.0
PER_TOKEN_MS = 0.028
GOAL_MS = 80.0
#: The capacity search's resolution (``budget.capacity_resolution``'s default).
RESOLUTION = 0.1
PAD_FLAGS = ("--pad-buckets", "auto", "--pad-values", "INPUT_IDS=0,ATTENTION_MASK=0")
WAYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # way: (perfsweep run flags, perfsweep load flags that send the same traffic)
    "plain": ((), ()),
    "ragged": (("--ragged-batch", "search"), ()),
    "buckets": (PAD_FLAGS, PAD_FLAGS),
}


def sentence_lengths(count: int = 8, seed: int = 50) -> list[int]:
    """Token counts of 8 sentences from 12 to 200 (both ends present), in random order."""
    rng = random.Random(seed)
    lengths = [12, 200, *(rng.randint(12, 200) for _ in range(count - 2))]
    rng.shuffle(lengths)
    return lengths


def archive(commit: str, work: Path) -> Path:
    """A ``git archive`` of ``commit`` under ``work``: that perfsweep's own ``analyzer``."""
    src = work / f"before-{commit}"
    src.mkdir(parents=True)
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar.stdout, check=True)
    return src


def prediction_errors(run_dir: Path) -> list[dict[str, Any]]:
    """Every measured config of a run (baseline and trials) with its prediction and the
    relative error ``predicted / measured - 1`` (None where either is missing)."""
    out = []
    paths = sorted(run_dir.glob("*/measurement.json")) + sorted(
        run_dir.glob("trials/*/measurement.json")
    )
    for path in paths:
        r = json.loads(path.read_text())
        measured = r.get("throughput_rps") if r.get("state") == "complete" else None
        predicted = (r.get("prediction") or {}).get("capacity_rps")
        error = predicted / measured - 1.0 if predicted and measured else None
        out.append(
            {
                "trial": path.parent.name,
                "config": r.get("config"),
                "measured_rps": measured,
                "predicted_rps": predicted,
                "error": None if error is None else round(error, 3),
            }
        )
    return out


def sweep(
    triton: RealTriton, work: Path, name: str, data: Path, cwd: Path | None, *flags: str
) -> dict[str, Any]:
    """One ``perfsweep run`` (from ``cwd``'s perfsweep when given): its wall time, phases,
    answer and every measured config's prediction error."""
    run_dir = work / name
    program = (
        [sys.executable, "-c", "import sys; from analyzer.cli import main; sys.exit(main())"]
        if cwd is not None
        else list(CLI)
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [
            *program,
            *("run", "--url", f"http://{triton.http_url}", "--model", MODEL),
            *("--input-data", str(data), "--p99-ms", f"{GOAL_MS:g}"),
            *("--run-dir", str(run_dir), "--no-report", "--leave", "best", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=cwd,
    )
    wall = time.monotonic() - t0
    if done.returncode not in (0, 1):
        raise RuntimeError(
            f"{name}: perfsweep run failed\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    phases = {k: round(float(v), 1) for k, v in (summary.get("phases") or {}).items()}
    best = summary.get("best") or {}
    errors = prediction_errors(run_dir)
    known = [abs(e["error"]) for e in errors if e["error"] is not None]
    return {
        "wall_s": round(wall, 1),
        "phases_s": phases,
        "validation_share": round(phases.get("validation", 0.0) / wall, 3) if wall else None,
        "trials": summary["trials"]["complete"],
        "stop_reason": summary["stop_reason"],
        "answer": best.get("config"),
        "capacity_rps": best.get("throughput_rps"),
        "measured": errors,
        "max_abs_prediction_error": round(max(known), 3) if known else None,
        "median_abs_prediction_error": round(statistics.median(known), 3) if known else None,
        "batching_note": (summary.get("batching") or {}).get("note"),
        "console_tail": done.stdout[-2000:],
    }


def measured_capacity(triton: RealTriton, work: Path, name: str, data: Path, *flags: str) -> float:
    """The loaded answer's capacity at the goal, by ``perfsweep load --find-capacity``."""
    out = work / f"{name}-capacity.json"
    done = subprocess.run(
        [
            *CLI,
            *("load", "--url", triton.http_url, "--model", MODEL, "--input-data", str(data)),
            *("--find-capacity", "--p99-ms", f"{GOAL_MS:g}", "--resolution", f"{RESOLUTION:g}"),
            *("--output", str(out), *flags),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name}: perfsweep load failed\n{done.stdout[-3000:]}")
    return float(json.loads(out.read_text())["capacity"]["capacity_rps"])


def run(
    work: Path, before: str, sides: list[str], ways: list[str], measure_answers: bool
) -> dict[str, Any]:
    data = work / "sentences.json"
    lengths = sentence_lengths()
    write_data_file(data, lengths)
    config, source = padded_sequence_model(
        MODEL,
        base_ms=BASE_MS,
        per_token_ms=PER_TOKEN_MS,
        allow_ragged_batch=False,
        host_ms=HOST_MS,
        device_lock=str(work / "device.lock"),
    )
    old = archive(before, work) if "before" in sides else None
    rows: dict[str, Any] = {}
    started = time.monotonic()
    with RealTriton(TritonInstall.locate(), work / "triton") as triton:
        triton.add_model(config, source)
        for way in ways:
            run_flags, load_flags = WAYS[way]
            for side in sides:
                name = f"{side}-{way}"
                triton.load_model(MODEL, config)  # the model's own config before every row
                row = sweep(triton, work, name, data, old if side == "before" else None, *run_flags)
                if measure_answers:
                    row["answer_load_rps"] = measured_capacity(
                        triton, work, name, data, *load_flags
                    )
                rows[name] = row
                print(
                    f"{name}: {row['wall_s']} s, {row['trials']} trials, "
                    f"{row['capacity_rps']} req/s, phases {row['phases_s']}",
                    flush=True,
                )
    mean_tokens = statistics.fmean(lengths)
    return {
        "claims": claims(rows),
        "model": {
            "host_ms_per_request": HOST_MS,
            "device_ms": f"{BASE_MS} + {PER_TOKEN_MS} x rows x longest",
            "device_ms_at_mean_length": round(BASE_MS + PER_TOKEN_MS * mean_tokens, 2),
            "serial_rps_without_batches": round(1000.0 / (BASE_MS + PER_TOKEN_MS * mean_tokens), 1),
            "sentence_tokens": lengths,
            "goal_p99_ms": GOAL_MS,
        },
        "before_commit": before,
        "benchmark_wall_s": round(time.monotonic() - started, 1),
        "rows": rows,
    }


def claims(rows: dict[str, Any]) -> dict[str, Any]:
    """What the issue asks of the after rows, checked on this run's rows (None: a row missing)."""
    b, a = rows.get("before-plain"), rows.get("after-plain")
    time_ratio = round(a["wall_s"] / b["wall_s"], 3) if a and b else None
    capacity_ratio = (
        round(a["capacity_rps"] / b["capacity_rps"], 3)
        if a and b and a["capacity_rps"] and b["capacity_rps"]
        else None
    )
    after = {k: r for k, r in rows.items() if k.startswith("after-")}
    shares = {k: r["validation_share"] for k, r in after.items()}
    worst = {k: r["max_abs_prediction_error"] for k, r in after.items()}
    known = [v for v in worst.values() if v is not None]
    return {
        "plain_time_ratio": time_ratio,
        "plain_at_most_half_the_time": None if time_ratio is None else time_ratio <= 0.5,
        "plain_capacity_ratio": capacity_ratio,
        "plain_same_capacity": (
            None if capacity_ratio is None else abs(capacity_ratio - 1.0) <= RESOLUTION
        ),
        "validation_shares": shares,
        "validation_at_most_a_quarter": (
            all(s is not None and s <= 0.25 for s in shares.values()) if shares else None
        ),
        "max_abs_prediction_errors": worst,
        "predictions_within_20pct": all(v <= 0.2 for v in known) if known else None,
    }


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "| run | wall | trials | stopped by | answer | capacity | validation | phases | "
        "prediction error (max, median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        a = row["answer"] or {}
        label = (
            f"mbs={a.get('max_batch_size')} delay={a.get('max_queue_delay_us')}us "
            f"x{a.get('instance_count')}" + (" ragged" if a.get("ragged_batch") else "")
        )
        phases = ", ".join(f"{k} {v:.0f}" for k, v in row["phases_s"].items())
        cap = row["capacity_rps"]
        load = f" (load {row['answer_load_rps']:.0f})" if "answer_load_rps" in row else ""
        err = row["max_abs_prediction_error"]
        med = row["median_abs_prediction_error"]
        lines.append(
            f"| {name} | {row['wall_s']:.0f} s | {row['trials']} | {row['stop_reason']} | "
            f"{label} | {cap or 0:.0f} req/s{load} | {row['validation_share'] or 0:.0%} | "
            f"{phases} | "
            + (f"{err:.0%}, {med:.0%}" if err is not None and med is not None else "n/a")
            + " |"
        )
    return "\n".join(
        [
            *lines,
            "",
            f"benchmark wall: {result['benchmark_wall_s']:.0f} s",
            f"claims: {json.dumps(result['claims'])}",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE_COMMIT, help="the commit of the before rows")
    parser.add_argument("--sides", default="before,after", help="comma-separated: before, after")
    parser.add_argument(
        "--ways", default="plain,ragged,buckets", help="comma-separated: plain, ragged, buckets"
    )
    parser.add_argument(
        "--measure-answers",
        action="store_true",
        help="also measure each answer's capacity by perfsweep load --find-capacity",
    )
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    ways = [w for w in args.ways.split(",") if w]
    unknown = [s for s in sides if s not in ("before", "after")] + [
        w for w in ways if w not in WAYS
    ]
    if unknown or not sides or not ways:
        parser.error(f"unknown or missing sides/ways: {unknown}; see --help")
    return run_recorded(
        "evidence_speed",
        1,
        lambda work: run(work, args.before, sides, ways, args.measure_answers),
        table,
    )


if __name__ == "__main__":
    raise SystemExit(main())
