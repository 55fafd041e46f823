"""Time to answer on a variable-length model, before and after the plateau rule and the ways to
make batches form, with the answer's capacity beside each.

The model: a Python-backend text classifier on a real Triton 2.51 (nvidia-pytriton's
``tritonserver``), INT64 ``[-1]`` token ids and mask, executing ``BASE_MS + PER_TOKEN_MS x rows
x longest sentence`` per batch (:mod:`tests.support.text_model`), fed a data file of 40
sentences of 12 to 300 tokens in random order. Its own config: no ``allow_ragged_batch``, so
Triton batches requests of equal shapes only.

One scenario for every row (:func:`tests.support.text_model.text_scenario`: p99 <= 200 ms, max
batch 1-8, delays 0-20 ms, 1-2 instances, 20 trials, ``--search predict``):

* ``before``: ``perfsweep run`` of commit ``--before`` (default :data:`BEFORE_COMMIT`, the last
  one without the plateau rule, ragged batches or buckets), run from a ``git archive`` of it;
* ``after``: this perfsweep, the same flags;
* ``ragged``: this perfsweep with ``--ragged-batch search``;
* ``buckets``: this perfsweep with ``[input] pad_buckets = "auto"`` (pad value 0 for both
  inputs): the client pads each request to the quartile bucket of its length;
* ``before-tpe``, ``after-tpe``: ``--search tpe`` with the instance count fixed at 2, so that
  only the knobs batches would need are searched (the plateau of the issue's report: every trial
  within noise of the others), by ``before``'s perfsweep and by this one.

Every sweep leaves its answer loaded (``--leave best``); the answer's capacity is then measured
by ``perfsweep load --find-capacity`` (this perfsweep) with the traffic that answer names (the
same data file; padded to the same buckets for ``buckets``), and the model's own config is
loaded back before the next row. Time to answer is each ``perfsweep run`` process, start to
recommendation. Quality is each answer's measured capacity over ``before``'s.

``--cpu``: the model spins a core for its execution time instead of sleeping, so on this
2-core machine (Triton and the load generator beside it) a second instance adds little while
the simulator, which models instances of one device, predicts more: the plateau of measured
configs that no prediction rule settles, where the plateau rule has to end the search.

Usage (repository root; ~15 min each)::

    .venv/bin/python benchmarks/ragged_text.py
    .venv/bin/python benchmarks/ragged_text.py --cpu --rows before,after

It prints a markdown table and writes ``benchmarks/results/ragged_text-<UTC>.json``
(``format_version`` 1).
"""

from __future__ import annotations

import argparse
import json
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
from tests.support.text_model import (  # noqa: E402
    padded_sequence_model,
    sentence_lengths,
    text_scenario,
    write_data_file,
)

#: The last commit without the plateau rule, ragged batches or buckets.
BEFORE_COMMIT = "7bf6a14"
MODEL = "textcls"
BASE_MS = 12.0
PER_TOKEN_MS = 0.006
GOAL_MS = 200.0
#: The bucket row's padding: ``[input]`` keys, and the same as ``perfsweep load`` flags.
PADDING = 'pad_buckets = "auto"\npad_values = {INPUT_IDS = 0, ATTENTION_MASK = 0}\n'
PADDING_FLAGS = ("--pad-buckets", "auto", "--pad-values", "INPUT_IDS=0,ATTENTION_MASK=0")


def archive(commit: str, work: Path) -> Path:
    """A ``git archive`` of ``commit`` under ``work``: that perfsweep's own ``analyzer``."""
    src = work / f"before-{commit}"
    src.mkdir(parents=True)
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar.stdout, check=True)
    return src


def sweep(
    triton: RealTriton, work: Path, name: str, scenario: str, cwd: Path | None, *flags: str
) -> dict[str, Any]:
    """One ``perfsweep run`` (from ``cwd``'s perfsweep when given): its wall time and answer."""
    path = work / f"{name}.toml"
    path.write_text(scenario)
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
            *("run", "--scenario", str(path), "--url", f"http://{triton.http_url}"),
            *("--run-dir", str(run_dir), "--no-report", "--leave", "best", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=cwd,
    )
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(
            f"{name}: perfsweep run failed\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "trials": summary["trials"]["complete"],
        "stop_reason": summary["stop_reason"],
        "answer": summary["best"]["config"],
        "answer_search_rps": summary["best"]["throughput_rps"],
        "batching_note": (summary.get("batching") or {}).get("note"),
        "recommendation": (summary.get("recommendation") or {}).get("detail"),
        "console_tail": done.stdout[-1500:],
    }


def capacity(triton: RealTriton, work: Path, name: str, *flags: str) -> float:
    """The loaded config's capacity at the goal, by ``perfsweep load --find-capacity``."""
    out = work / f"{name}-capacity.json"
    done = subprocess.run(
        [
            *CLI,
            *("load", "--url", triton.http_url, "--model", MODEL),
            *("--input-data", str(work / "sentences.json"), "--find-capacity"),
            *("--p99-ms", f"{GOAL_MS:g}", "--resolution", "0.1", "--output", str(out), *flags),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{name}: perfsweep load failed\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    return float(json.loads(out.read_text())["capacity"]["capacity_rps"])


def run(work: Path, before: str, rows: list[str], cpu: bool) -> dict[str, Any]:
    data = work / "sentences.json"
    write_data_file(data, sentence_lengths())
    config, source = padded_sequence_model(
        MODEL, base_ms=BASE_MS, per_token_ms=PER_TOKEN_MS, allow_ragged_batch=False, burn=cpu
    )
    plain = text_scenario(data, model=MODEL)
    old = archive(before, work) if before and any(r.startswith("before") for r in rows) else None
    # The user's instance count fixed at 2 and TPE choosing: only knobs that cannot matter left.
    fixed = text_scenario(data, model=MODEL, instances=(2, 2), strategy="tpe")
    cases: dict[str, tuple[str, Path | None, tuple[str, ...], tuple[str, ...]]] = {
        "before": (plain, old, (), ()),
        "after": (plain, None, (), ()),
        "ragged": (plain, None, ("--ragged-batch", "search"), ()),
        "buckets": (plain.replace("[traffic]", PADDING + "[traffic]"), None, (), PADDING_FLAGS),
        "before-tpe": (fixed, old, (), ()),
        "after-tpe": (fixed, None, (), ()),
    }
    results: dict[str, Any] = {}
    with RealTriton(TritonInstall.locate(), work / "triton") as triton:
        triton.add_model(config, source)
        for name in rows:
            if name.startswith("before") and not before:
                continue
            scenario, cwd, flags, load_flags = cases[name]
            triton.load_model(MODEL, config)  # the model's own config before every row
            row = sweep(triton, work, name, scenario, cwd, *flags)
            row["capacity_rps"] = capacity(triton, work, name, *load_flags)
            results[name] = row
            print(f"{name}: {row['wall_s']} s, {row['trials']} trials, {row['capacity_rps']} req/s")
    # Quality against before's answer (this perfsweep's when before did not run; a tpe row
    # against its own before).
    for name, row in results.items():
        base = results.get("before-tpe" if name.endswith("tpe") else "before") or results.get(
            "after"
        )
        row["quality"] = round(row["capacity_rps"] / base["capacity_rps"], 3) if base else None
    return {
        "claims": claims(results),
        "model": {
            "base_ms": BASE_MS,
            "per_token_ms": PER_TOKEN_MS,
            "goal_p99_ms": GOAL_MS,
            "execution": "cpu (spins)" if cpu else "device (sleeps)",
        },
        "before_commit": before,
        "rows": results,
    }


def claims(rows: dict[str, Any]) -> dict[str, Any]:
    """What the issue asked of each way, checked on this run's rows (a row missing: None)."""

    def ratio(a: str, b: str, key: str) -> float | None:
        if a not in rows or b not in rows or not rows[b][key]:
            return None
        return round(rows[a][key] / rows[b][key], 3)

    ragged = ratio("ragged", "after", "capacity_rps")
    plateau = rows.get("after-tpe")
    same = ratio("after-tpe", "before-tpe", "capacity_rps")
    return {
        "ragged_capacity_ratio": ragged,
        "ragged_at_least_2x": None if ragged is None else ragged >= 2.0,
        "buckets_capacity_ratio": ratio("buckets", "after", "capacity_rps"),
        "plateau_trials": None if plateau is None else plateau["trials"],
        "plateau_within_6_trials": None if plateau is None else plateau["trials"] <= 6,
        "plateau_time_ratio": ratio("after-tpe", "before-tpe", "wall_s"),
        "plateau_capacity_ratio": same,
        "plateau_answer_as_good": None if same is None else same >= 0.9,
    }


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "| run | time to answer | trials | stopped by | answer | capacity (load) | vs before |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        base = rows.get("before-tpe" if name.endswith("tpe") else "before") or row
        a = row["answer"]
        label = (
            f"mbs={a['max_batch_size']} delay={a['max_queue_delay_us']}us x{a['instance_count']}"
            + (" ragged" if a.get("ragged_batch") else "")
        )
        lines.append(
            f"| {name} | {row['wall_s']:.0f} s ({row['wall_s'] / base['wall_s']:.2f}x) | "
            f"{row['trials']} | {row['stop_reason']} | {label} | {row['capacity_rps']:.0f} req/s "
            f"| {row['quality'] or 1.0:.2f}x |"
        )
    return "\n".join([*lines, "", f"claims: {json.dumps(result.get('claims', {}))}"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE_COMMIT, help="'' skips the before row")
    parser.add_argument(
        "--rows", default="before,after,ragged,buckets", help="comma-separated rows to run"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="the model spins a core for its execution time instead of sleeping: instances "
        "beyond the free cores add nothing (the plateau the simulator does not foresee)",
    )
    args = parser.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    name = "ragged_text_cpu" if args.cpu else "ragged_text"
    return run_recorded(name, 1, lambda work: run(work, args.before, rows, args.cpu), table)


if __name__ == "__main__":
    raise SystemExit(main())
