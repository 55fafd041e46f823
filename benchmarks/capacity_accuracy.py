"""The capacity search against a known capacity: ``perfsweep load --find-capacity`` within 10 %.

A model whose capacity follows from its own service time (one instance, no batching, a fixed
time per execution: at most ``1e6 / service_us`` requests a second, whatever the latency goal;
below that rate constant arrivals never queue, above it the queue and with it the p99 grow
without bound) is searched by ``perfsweep load --find-capacity`` from 10 req/s, constant
arrivals, a p99 goal far above the service time. Cases (``--case``, default ``all``):

* ``sim``: the reference server's simulated device, jitter-free, 20 ms per execution: truth
  ``1000 / 20 = 50`` req/s. Goal p99 200 ms.
* ``triton``: a real Triton 2.51 (the ``tritonserver`` of the nvidia-pytriton wheel,
  ``tests/support/real_triton.py``) with a Python-backend model that sleeps 20 ms per
  execution: truth ``1e6 / service_us``, where ``service_us`` is the time per request Triton
  itself reports at the capacity's level (compute input + infer + output: the sleep plus the
  Python stub's overhead). Goal p99 250 ms and ``--confirm-failures`` spelled out (the
  command's default in both cases): real Triton has rare 60-120 ms outliers
  (``notes/real-triton.md``). Skipped, with the reason, under ``--case all``
  where the wheel's Triton is unavailable; ``--case triton`` then exits 2.

Each case records the command, the capacity found, the truth and how it was derived, the ratio
capacity / truth, every point tried (rate, p99, whether it met the goal, as the search judged
it) and ``claims``: the capacity within 10 % of the truth, ``perfsweep load`` exiting 0, and
the truth's premise (``sim``: every execution served one request; ``triton``: Triton's service
time 1-1.5x the model's sleep).

Command (repository root): ``.venv/bin/python benchmarks/capacity_accuracy.py`` (``--case
sim|triton|all``; estimated at a minute or two each: a dozen or so steps of at most 5 s, plus
Triton's start). Prints a markdown table and writes
``benchmarks/results/capacity_accuracy-<UTC>.json`` (``format_version`` 1). Loopback only;
every server it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.measure.generator import read_load_output  # noqa: E402
from analyzer.measure.goals import meets_goals  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.load.refserver import RefServer, write_sim_model  # noqa: E402
from tests.support.real_triton import (  # noqa: E402
    RealTriton,
    TritonInstall,
    TritonUnavailable,
    sleep_model_config,
)

FORMAT_VERSION = 1

#: How close the capacity found must be to the truth, relative.
TOLERANCE = 0.10
#: ``sim``: the simulated device's time per execution, ms, and the p99 goal.
SIM_DEVICE_MS = 20.0
SIM_P99_MS = 200.0
#: ``triton``: the Python model's sleep per execution, ms, and the p99 goal (see the docstring).
TRITON_DELAY_MS = 20.0
TRITON_P99_MS = 250.0
#: The most one ``perfsweep load`` may take, seconds.
LOAD_TIMEOUT_S = 400.0
#: Every case's search: constant arrivals from 10 req/s, short steps.
SEARCH_ARGS = (
    "--arrival",
    "constant",
    "--start-rps",
    "10",
    "--window-s",
    "1.5",
    "--max-windows",
    "3",
    "--warmup-s",
    "0.5",
)
CASES = ("sim", "triton")


def load_args(
    url: str, model: str, metrics_url: str, p99_ms: float, extra: Sequence[str], output: Path
) -> list[str]:
    """The arguments of ``perfsweep load --find-capacity`` for one case."""
    return [
        "load",
        "--url",
        url,
        "--model",
        model,
        "--metrics-url",
        metrics_url,
        "--find-capacity",
        "--p99-ms",
        f"{p99_ms:g}",
        *SEARCH_ARGS,
        *extra,
        "--output",
        str(output),
    ]


def search(args: list[str], output: Path) -> dict[str, Any]:
    """Run ``perfsweep`` with ``args``; its exit, wall time and ``--output`` document (None when
    it wrote none)."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "perfsweep"), *args],
            capture_output=True,
            text=True,
            timeout=LOAD_TIMEOUT_S,
            cwd=ROOT,
        )
        exit_code: int | None = done.returncode
        tail = (done.stderr[-3000:] + done.stdout[-3000:]) if done.returncode else ""
    except subprocess.TimeoutExpired:
        exit_code, tail = None, f"timed out after {LOAD_TIMEOUT_S:g} s"
    return {
        "command": "perfsweep " + " ".join(args),
        "exit_code": exit_code,
        "wall_s": round(time.perf_counter() - started, 1),
        "output_tail": tail,
        "doc": json.loads(output.read_text()) if output.is_file() else None,
    }


def case_result(
    ran: Mapping[str, Any],
    server: str,
    truth: Callable[[Mapping[str, Any] | None], tuple[float | None, str, dict[str, bool]]],
) -> dict[str, Any]:
    """One case's record: ``truth(best)`` gives the true capacity from the capacity's level
    (the server's view of it: the ``best`` point's dict, None when nothing passed), how it was
    derived, and the claims on its premise."""
    doc = ran["doc"]
    points: list[dict[str, Any]] = []
    capacity_rps = 0.0
    best: Mapping[str, Any] | None = None
    summary: dict[str, Any] = {}
    if doc is not None:
        _, found = read_load_output(doc)
        assert found is not None, "perfsweep load --find-capacity wrote no capacity"
        capacity_rps = found.capacity_rps
        best = doc["capacity"]["best"]
        summary = {
            "bracketed": found.bracketed,
            "message": found.message,
            "goal_p99_ms": found.goals.p99_ms,
        }
        for p in found.points:
            passed, reason = meets_goals(p, found.goals)
            points.append(
                {
                    "rate_rps": p.target,
                    "p99_ms": round(p.p99_ms, 2),
                    "passed": passed,
                    "valid": p.valid,
                    "reason": reason,
                }
            )
    true_rps, derivation, premise = truth(best)
    ratio = capacity_rps / true_rps if true_rps else None
    within = ratio is not None and 1 - TOLERANCE <= ratio <= 1 + TOLERANCE
    return {
        "server": server,
        "command": ran["command"],
        "exit_code": ran["exit_code"],
        "wall_s": ran["wall_s"],
        **({"output_tail": ran["output_tail"]} if ran["output_tail"] else {}),
        "capacity_rps": capacity_rps,
        "truth_rps": round(true_rps, 2) if true_rps else None,
        "truth_derivation": derivation,
        "ratio": round(ratio, 3) if ratio is not None else None,
        **summary,
        "points": points,
        "claims": {
            f"capacity within {100 * TOLERANCE:g} % of the truth": within,
            "perfsweep load exited 0": ran["exit_code"] == 0,
            **premise,
        },
    }


def run_sim(work: Path) -> dict[str, Any]:
    write_sim_model(work / "repo", "cap", SIM_DEVICE_MS)
    output = work / "capacity.json"
    with RefServer(work / "repo", ("cap",)) as srv:
        ran = search(
            load_args(srv.http_url, "cap", srv.metrics_url, SIM_P99_MS, (), output), output
        )

    def truth(best: Mapping[str, Any] | None) -> tuple[float, str, dict[str, bool]]:
        batch = ((best or {}).get("server") or {}).get("avg_batch_size")
        return (
            1000.0 / SIM_DEVICE_MS,
            f"1000 / {SIM_DEVICE_MS:g} ms: one instance, no batching, a jitter-free "
            f"{SIM_DEVICE_MS:g} ms per execution",
            {"premise: every execution at the capacity served one request": batch == 1.0},
        )

    return case_result(ran, "reference --device sim", truth)


def run_triton(work: Path, install: TritonInstall) -> dict[str, Any]:
    model = "ps_sleep20"
    config = sleep_model_config(model, max_batch_size=0, execute_delay_ms=TRITON_DELAY_MS)
    output = work / "capacity.json"
    with RealTriton(install, work / "triton", models=[config]) as triton:
        args = load_args(
            triton.http_url,
            model,
            triton.metrics_url,
            TRITON_P99_MS,
            ("--confirm-failures",),
            output,
        )
        ran = search(args, output)

    def truth(best: Mapping[str, Any] | None) -> tuple[float | None, str, dict[str, bool]]:
        server = (best or {}).get("server") or {}
        service_us = sum(
            server.get(key, 0.0)
            for key in ("compute_input_us", "compute_infer_us", "compute_output_us")
        )
        sleep_us = TRITON_DELAY_MS * 1000
        derivation = (
            f"1e6 / service_us, service_us = compute input + infer + output per request as "
            f"Triton reports it at the capacity's level: {service_us:.0f} us "
            f"(the model sleeps {sleep_us:.0f} us an execution)"
        )
        premise = {
            "premise: Triton's service time 1-1.5x the model's sleep": (
                sleep_us <= service_us <= 1.5 * sleep_us
            )
        }
        return (1e6 / service_us if service_us else None), derivation, premise

    return case_result(ran, "triton 2.51 (nvidia-pytriton), Python backend", truth)


def run(
    cases: Sequence[str], work: Path, install: TritonInstall | None, skipped: Mapping[str, str]
) -> dict[str, Any]:
    measured: dict[str, Any] = {}
    if "sim" in cases:
        measured["sim"] = run_sim(work / "sim")
    if "triton" in cases:
        assert install is not None
        measured["triton"] = run_triton(work / "triton", install)
    return {"tolerance": TOLERANCE, "cases": measured, "skipped": dict(skipped)}


def _verdict(point: Mapping[str, Any]) -> str:
    # An invalid step says nothing of the server: the search measures it again.
    if point["passed"]:
        return "pass"
    return "fail" if point["valid"] else "invalid"


def table(result: Mapping[str, Any]) -> str:
    out = [
        "| case | server | capacity (req/s) | truth (req/s) | capacity / truth "
        f"| within {100 * result['tolerance']:g} % | steps | exit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, case in result["cases"].items():
        truth = "-" if case["truth_rps"] is None else f"{case['truth_rps']:.1f}"
        ratio = "-" if case["ratio"] is None else f"{case['ratio']:.3f}"
        within = next(iter(case["claims"].values()))
        out.append(
            f"| {name} | {case['server']} | {case['capacity_rps']:.1f} | {truth} | {ratio} "
            f"| {'yes' if within else 'no'} | {len(case['points'])} | {case['exit_code']} |"
        )
    for name, reason in result["skipped"].items():
        out.append(f"| {name} | skipped: {reason} | | | | | | |")
    for name, case in result["cases"].items():
        steps = ", ".join(
            f"{p['rate_rps']:g} ({p['p99_ms']:.0f} ms, {_verdict(p)})" for p in case["points"]
        )
        out += [
            "",
            f"### {name}: truth {case['truth_derivation']}",
            "",
            f"steps (rate req/s, p99, verdict): {steps or 'none'}",
            "",
            *(
                f"- {text}: **{'held' if held else 'did not hold'}**"
                for text, held in case["claims"].items()
            ),
        ]
        if case.get("output_tail"):
            out += ["", "perfsweep load failed:", "", "```", case["output_tail"], "```"]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case",
        choices=(*CASES, "all"),
        default="all",
        help="sim (the reference server's simulated device), triton (a real Triton) or all "
        "(default; triton skipped where unavailable)",
    )
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    args = parser.parse_args()
    cases = list(CASES if args.case == "all" else (args.case,))
    install = None
    skipped: dict[str, str] = {}
    if "triton" in cases:
        # Before any search, so that a missing Triton is said at once.
        try:
            install = TritonInstall.locate()
        except TritonUnavailable as exc:
            if args.case == "triton":
                print(f"--case triton needs the real Triton: {exc}", file=sys.stderr)
                return 2
            print(f"skipping case triton: it needs the real Triton: {exc}", file=sys.stderr)
            cases.remove("triton")
            skipped["triton"] = f"real Triton unavailable: {exc}"
    return run_recorded(
        "capacity_accuracy",
        FORMAT_VERSION,
        lambda work: run(cases, work, install, skipped),
        table,
        output=args.output,
        keep=args.keep,
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
