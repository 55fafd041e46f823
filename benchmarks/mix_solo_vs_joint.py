"""Models served together, tuned together, against the same models each tuned alone.

Each model tuned alone (``perfsweep run --model m``: the device to itself, its own goal) and the
answers applied together, against the models tuned as one (``perfsweep run --mix``: every model's
knobs in one search, each model held to its own goal); both repository trees served by a fresh
server and measured by one instrument, ``perfsweep load`` of the mix.

The models (benchmarks/mixes.py): ``rank`` is heavy with a loose goal, so alone two instances
and its largest batches serve the most; beside it ``tag`` has a tight goal, and the device time
``rank``'s two instances spend on small batches is ``tag``'s wait.

Cases (``--case``, default ``both``):

* ``three``: ``rank``, ``tag`` and ``embed`` on the reference server's simulated device
  (``--device sim``: one simulated device for every instance of every model); each model swept
  alone with 2 trials, the mix with 8. The solo tree is loaded at the mix's target rate
  (125 req/s, ``perfsweep load --mix ... --rate-rps 125``); the joint tree's capacity of the
  mix (``--find-capacity``, every model within its own goal, up to 250 req/s by 10 % steps).
  Claims: the solo answers together miss a goal at the target rate, and ``joint_capacity >=
  target``.
* ``two``: ``rank`` and ``tag`` as Python-backend models on a real Triton 2.51 (the
  ``tritonserver`` of the nvidia-pytriton wheel, ``tests/support/real_triton.py``) whose device
  parts share one file lock; each model swept alone with 2 trials, the mix with 6; both trees'
  capacities of the mix (up to 600 req/s by 10 % steps), solo first. Claim: ``joint_capacity >
  solo_capacity * (1 + resolution)`` (above by more than one step of the capacity search).

Command (repository root): ``.venv/bin/python benchmarks/mix_solo_vs_joint.py`` (``--case
three``: ~8 min here; ``--case two``: ~10 min). Prints a markdown table per case and writes
``benchmarks/results/mix_solo_vs_joint-<UTC>.json`` (``format_version`` 1): each case's figures
and ``claims``, each claim's text mapped to whether it held. Loopback only; every server it
starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.rundir.results import load_summary  # noqa: E402
from benchmarks.mixes import (  # noqa: E402
    THREE,
    TWO,
    Models,
    SimServer,
    TritonServer,
    joint_tree,
    load_mix,
    mix_capacity,
    mix_flag,
    solo_tree,
)
from benchmarks.record import run_recorded  # noqa: E402
from tests.support.real_triton import TritonInstall, TritonUnavailable  # noqa: E402

FORMAT_VERSION = 1

#: Trials of each model's sweep alone (both cases).
SOLO_TRIALS = 2

#: ``three``: the mix's target rate (every model its share of it), req/s; the sweeps' ceiling,
#: the joint sweep's trials, and how the joint tree's capacity is measured (up to twice the
#: target, by 10 % steps).
THREE_TARGET_RPS = 125.0
THREE_SWEEP_MAX_RPS = 1000.0
THREE_JOINT_TRIALS = 8
THREE_CAPACITY_MAX_RPS = 2 * THREE_TARGET_RPS
THREE_RESOLUTION = 0.1

#: ``two``: the sweeps' ceiling, the joint sweep's trials, and how both trees' capacities are
#: measured on Triton.
TWO_SWEEP_MAX_RPS = 600.0
TWO_JOINT_TRIALS = 6
TWO_CAPACITY_MAX_RPS = 600.0
TWO_RESOLUTION = 0.1


def describe_models(models: Models) -> dict[str, Any]:
    return {
        name: {
            "share": m.share,
            "p99_ms": m.p99_ms,
            "device_ms": [m.a_ms, m.b_ms],
            "host_ms": m.host_ms,
        }
        for name, m in models.items()
    }


def answer(run_dir: Path, model: str | None = None) -> dict[str, Any]:
    """What a sweep recommends: which config (``best`` or the original), its knobs (a model's
    own, or ``model``'s of a mix) and the capacity the sweep measured for it."""
    summary = load_summary(run_dir)
    recommended = (summary["recommendation"] or {}).get("config")
    kept = summary["best" if recommended == "best" else "baseline"] or {}
    config = kept.get("config") or {}
    return {
        "recommended": recommended,
        "knobs": config.get("stages", {}).get(model) if model else config,
        "own_capacity_rps": kept.get("throughput_rps"),
    }


def run_three(work: Path) -> dict[str, Any]:
    server = SimServer()
    repo = server.write(work / "repo", THREE)
    solo_runs, solo = solo_tree(
        server, THREE, repo, work, trials=SOLO_TRIALS, max_rate_rps=THREE_SWEEP_MAX_RPS
    )
    joint_run, joint = joint_tree(
        server, THREE, repo, work, trials=THREE_JOINT_TRIALS, max_rate_rps=THREE_SWEEP_MAX_RPS
    )
    apart = load_mix(server, THREE, solo, work / "load-solo", THREE_TARGET_RPS)
    together = mix_capacity(
        server,
        THREE,
        joint,
        work / "capacity-joint",
        max_rps=THREE_CAPACITY_MAX_RPS,
        resolution=THREE_RESOLUTION,
    )
    summary = load_summary(joint_run)
    best = summary["best"] or {}
    misses = apart.misses(THREE)
    return {
        "server": "reference --device sim",
        "models": describe_models(THREE),
        "mix": mix_flag(THREE),
        "target_rps": THREE_TARGET_RPS,
        "solo": {
            "trials": SOLO_TRIALS,
            "answers": {name: answer(run) for name, run in solo_runs.items()},
            "at_target": {"p99_ms": apart.p99_ms, "errors": apart.errors, "misses": misses},
        },
        "joint": {
            "trials": THREE_JOINT_TRIALS,
            "recommended": (summary["recommendation"] or {}).get("config"),
            "knobs": best.get("config", {}).get("stages"),
            "own_capacity_rps": best.get("throughput_rps"),
            "capacity_rps": together,
            "capacity_max_rps": THREE_CAPACITY_MAX_RPS,
            "resolution": THREE_RESOLUTION,
        },
        "claims": {
            "solo answers miss a goal at target_rps": bool(misses),
            "joint_capacity >= target": together >= THREE_TARGET_RPS,
            "the joint sweep recommends its best": (summary["recommendation"] or {}).get("config")
            == "best",
            "the joint sweep's own capacity >= target": (
                best.get("throughput_rps", 0.0) >= THREE_TARGET_RPS
            ),
            "the joint sweep's best sets every model": (
                set(best.get("config", {}).get("stages", {})) == set(THREE)
            ),
        },
    }


def run_two(work: Path, install: TritonInstall) -> dict[str, Any]:
    server = TritonServer(install)
    repo = server.write(work / "repo", TWO)
    solo_runs, solo = solo_tree(
        server, TWO, repo, work, trials=SOLO_TRIALS, max_rate_rps=TWO_SWEEP_MAX_RPS
    )
    joint_run, joint = joint_tree(
        server, TWO, repo, work, trials=TWO_JOINT_TRIALS, max_rate_rps=TWO_SWEEP_MAX_RPS
    )
    # One instrument for both trees, once each: the answers are several times apart in the runs
    # seen (the solo tree's capacity is bounded by tag's goal beside rank's two instances).
    capacity = {"max_rps": TWO_CAPACITY_MAX_RPS, "resolution": TWO_RESOLUTION}
    solo_rps = mix_capacity(server, TWO, solo, work / "measure-solo", **capacity)
    joint_rps = mix_capacity(server, TWO, joint, work / "measure-joint", **capacity)
    return {
        "server": "triton 2.51 (nvidia-pytriton), Python backend, one device lock",
        "models": describe_models(TWO),
        "mix": mix_flag(TWO),
        "solo": {
            "trials": SOLO_TRIALS,
            "answers": {name: answer(run) for name, run in solo_runs.items()},
            "capacity_rps": solo_rps,
        },
        "joint": {
            "trials": TWO_JOINT_TRIALS,
            "answers": {name: answer(joint_run, name) for name in TWO},
            "capacity_rps": joint_rps,
        },
        "capacity_max_rps": TWO_CAPACITY_MAX_RPS,
        "resolution": TWO_RESOLUTION,
        "capacity_ratio": round(joint_rps / solo_rps, 3) if solo_rps > 0 else None,
        "claims": {
            # Above by more than the capacity search's step: two trees a step apart may
            # measure alike.
            "joint_capacity > solo_capacity * (1 + resolution)": (
                joint_rps > solo_rps * (1 + TWO_RESOLUTION)
            ),
        },
    }


def run(case: str, work: Path, install: TritonInstall | None) -> dict[str, Any]:
    cases: dict[str, Callable[[], dict[str, Any]]] = {}
    if case in ("three", "both"):
        cases["three"] = lambda: run_three(work / "three")
    if case in ("two", "both"):
        assert install is not None
        cases["two"] = lambda: run_two(work / "two", install)
    return {"cases": {name: measure() for name, measure in cases.items()}}


def _claims(claims: Mapping[str, bool]) -> list[str]:
    return [f"- {text}: **{'held' if held else 'did not hold'}**" for text, held in claims.items()]


def table(result: Mapping[str, Any]) -> str:
    out: list[str] = []
    three = result["cases"].get("three")
    if three:
        solo, joint = three["solo"], three["joint"]
        p99 = ", ".join(f"{m} {v:.1f}" for m, v in solo["at_target"]["p99_ms"].items())
        goals = ", ".join(f"{m} {v['p99_ms']:g}" for m, v in three["models"].items())
        out += [
            f"### three models, {three['server']} (goals p99 ms: {goals})",
            "",
            "| answer | measured | figure |",
            "|---|---|---|",
            f"| solo | p99 ms at {three['target_rps']:g} req/s | {p99} "
            f"(misses: {', '.join(solo['at_target']['misses']) or 'none'}) |",
            f"| joint | capacity of the mix, every goal met (up to {joint['capacity_max_rps']:g}) "
            f"| {joint['capacity_rps']:.1f} req/s |",
            "",
            *_claims(three["claims"]),
            "",
        ]
    two = result["cases"].get("two")
    if two:
        out += [
            f"### two models, {two['server']}",
            "",
            "| answer | capacity of the mix, every goal met (req/s) |",
            "|---|---|",
            f"| solo | {two['solo']['capacity_rps']:.1f} |",
            f"| joint | {two['joint']['capacity_rps']:.1f} |",
            "",
            f"joint / solo capacity: {two['capacity_ratio']}x",
            "",
            *_claims(two["claims"]),
        ]
    return "\n".join(out).rstrip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case",
        choices=("three", "two", "both"),
        default="both",
        help="three models on the simulated device, two on a real Triton, or both (default)",
    )
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    args = parser.parse_args()
    install = None
    if args.case in ("two", "both"):
        # Before any sweep: the three-model case alone takes minutes.
        try:
            install = TritonInstall.locate()
        except TritonUnavailable as exc:
            print(f"--case {args.case} needs the real Triton: {exc}", file=sys.stderr)
            return 2
    return run_recorded(
        "mix_solo_vs_joint",
        FORMAT_VERSION,
        lambda work: run(args.case, work, install),
        table,
        output=args.output,
        keep=args.keep,
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
