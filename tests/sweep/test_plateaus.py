"""Plateaus: a sweep whose configs all serve the same stops early and recommends the cheapest.

A planted flat landscape in virtual time: the simulated device serialises every execution and
costs the same per item whatever the batch (2 ms an item, a 0.05 ms fixed part), so no batch
size, delay or instance count serves more than another. The profile the search predicts from is
planted wrong (a large fixed part: batching and instances look worth up to several times more),
as a profile taken on a busy host can be. The sweep must see from its own measurements that
nothing is left to gain, stop within 6 trials, and recommend the cheapest of the tied configs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import config_cost, knobs_from_dict
from analyzer.predict import virtual
from analyzer.predict.profile import Profile, RequestKind, RequestMix
from analyzer.predict.sources import from_toml
from analyzer.predict.virtual import VirtualServer
from analyzer.rundir.results import load_summary, parse_config_text
from analyzer.search.strategy import FLAT_MIN_MEASURED, Guide, band
from tests.support.servers import write_sim_model
from tests.support.sweeps import virtual_sweep

pytestmark = [pytest.mark.usefixtures("takes_seconds")]

SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
device = "sim"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 5000.0
[goals]
p99_ms = {p99_ms}
max_error_rate = 0.01
[space]
max_batch_size = [1, 8]
max_queue_delay_us = [0, 4000]
delay_steps = 2
preferred_batch_size = "none"
instance_count = [1, 2]
{extra}
[budget]
trials = 20
patience = 20
warmup_s = 0.3
window_s = 0.5
min_requests = 60
capacity_resolution = 0.1
[search]
strategy = "{strategy}"
"""

#: What the planted profile believes: 8 ms a batch + 0.1 ms an item, the host part overlapped.
PLANTED = """
name = "planted_profile"
provenance = "SYNTHETIC planted profile: batching looks worth it"
seed = 0
jitter = 0.0
[device]
a_ms = 8.0
b_ms = 0.1
[host_pre]
a_ms = 0.5
b_ms = 0.0
[host_post]
a_ms = 0.5
b_ms = 0.0
"""


def test_a_flat_landscape_stops_within_six_trials_on_the_cheapest_tied_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    # Its own config waits 60 ms for a batch that never pays: the searched configs beat it.
    write_sim_model(
        repo,
        "flat",
        0.05,
        per_item_ms=2.0,
        max_batch_size=16,
        dynamic_batching="dynamic_batching { max_queue_delay_microseconds: 60000 }",
    )
    planted = tmp_path / "planted.toml"
    planted.write_text(PLANTED)
    wrong = from_toml(planted, max_batch_size=16)

    def misleading_probe(self: VirtualServer, target: object, scenario: object) -> Profile:
        return wrong

    monkeypatch.setattr(VirtualServer, "profile", misleading_probe)
    # The predict phase simulates in this process: a unit test starts none.
    monkeypatch.setattr("analyzer.search.strategy.sim_workers", lambda: 1)
    scenario = tmp_path / "flat.toml"
    scenario.write_text(SCENARIO.format(model="flat", p99_ms=80.0, extra="", strategy="predict"))
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario), "--model-repository", str(repo)),
        *("--run-dir", str(run_dir)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    trials = [
        json.loads(p.read_text()) for p in sorted((run_dir / "trials").glob("0*/measurement.json"))
    ]
    assert 1 <= len(trials) <= 6, summary["stop_reason"]
    assert summary["stop_reason"] in ("nothing_left_to_gain", "prediction")
    # The planted profile promised several times the flat capacity to its best config.
    predicted = trials[0]["prediction"]["capacity_rps"]
    assert predicted > 1.5 * trials[0]["throughput_rps"]
    # Every measured config served the same, within the capacity search's resolution.
    served = [t["throughput_rps"] for t in trials if t["meets_goals"]]
    baseline = json.loads((run_dir / "baseline" / "measurement.json").read_text())
    assert max(served) <= 1.25 * min(served)
    # The cheapest config tied with the best in the search (the model's own config competes
    # too) is validated beside the winner, and the recommendation is the cheapest of the
    # validated configs tied within the resolution (fewest instances, then the smallest max
    # batch, then the shortest delay).
    tied = [
        knobs_from_dict(t["config"])
        for t in [baseline, *trials]
        if t["meets_goals"] and t["throughput_rps"] >= 0.9 * max(served)
    ]
    validation = summary["validation"]
    assert min(tied, key=config_cost) in {knobs_from_dict(c["config"]) for c in validation}
    passing = [c for c in validation if c["all_meet_goals"]]
    top = max(passing, key=lambda c: c["worst_rps"])
    assert summary["best"]["trial_number"] >= 0
    cheapest = min(
        (
            knobs_from_dict(c["config"])
            for c in passing
            if c["trial_number"] >= 0 and c["worst_rps"] >= 0.9 * top["worst_rps"]
        ),
        key=config_cost,
    )
    assert knobs_from_dict(summary["best"]["config"]) == cheapest
    assert f"stopped by: {summary['stop_reason']}" in done.stdout
    # The validation checks at one rate say the rate they checked, never a capacity of 0.
    assert "0.0 req/s" not in done.stdout
    # The tie is decided by cost: validation is one check of the cheapest tie, at the best
    # search capacity less the resolution, and no capacity is re-measured.
    [checked] = [c for c in validation if c["trial_number"] >= 0]
    assert knobs_from_dict(checked["config"]) == min(
        (knobs_from_dict(t["config"]) for t in trials if t["meets_goals"]), key=config_cost
    )
    assert checked["check_met"] is True and len(checked["measurements"]) == 1
    assert checked["check_rps"] == pytest.approx(0.9 * max(served))
    assert checked["measurements"][0] == checked["check"]
    assert "points" not in checked["measurements"][0]  # one step, no capacity search
    assert "re-measuring the whole capacities" not in done.stdout
    assert summary["best"]["trial_number"] == checked["trial_number"]
    assert "no capacity was re-measured" in summary["tie_break"]


def _guide(predictions: dict[Knobs, float]) -> Guide:
    """A guide holding these predictions (no predictor: the rule reads predictions only)."""
    guide = Guide(cast(Any, None), goal_p99_ms=80.0, half_width=0.1)
    guide.predictions = {k: band(v, 0.1) for k, v in predictions.items()}
    return guide


def test_measurements_flat_whatever_the_predictions_leave_nothing_to_gain() -> None:
    # The text classifier: predictions 196-240 req/s, every trial 171-187 req/s.
    measured = [(240.0, 180.0), (230.0, 187.0), (215.0, 171.0), (205.0, 183.0)]
    knobs = [Knobs(max_batch_size=2**i) for i in range(8)]
    guide = _guide({**{k: p for k, (p, _) in zip(knobs, measured, strict=False)}, knobs[4]: 225.0})
    points = [(k, p, m) for k, (p, m) in zip(knobs, measured, strict=False)]
    why = guide.nothing_left(points, bar_rps=187.0 * 1.1)
    assert why is not None and "nothing left to gain" in why and "171.0-187.0" in why
    # Fewer measurements than the rule needs: no verdict yet.
    assert guide.nothing_left(points[: FLAT_MIN_MEASURED - 1], bar_rps=187.0 * 1.1) is None


def test_a_prediction_that_ranks_measurements_keeps_the_search_going() -> None:
    # Predictions biased by 20 % but ordered: the line corrects the bias, and a config
    # predicted far above the best's prediction (beyond the measured range) is still worth it.
    measured = [(100.0, 80.0), (200.0, 160.0), (300.0, 240.0), (400.0, 320.0)]
    knobs = [Knobs(max_batch_size=2**i) for i in range(6)]
    guide = _guide({**dict(zip(knobs, [p for p, _ in measured], strict=False)), knobs[4]: 390.0})
    points = [(k, p, m) for k, (p, m) in zip(knobs, measured, strict=False)]
    # 390 predicted -> 312 expected: below the best (320) + resolution: nothing left.
    assert guide.nothing_left(points, bar_rps=320.0 * 1.1) is not None
    guide.predictions[knobs[5]] = band(390.0, 0.1)
    guide.predictions[knobs[4]] = band(600.0, 0.1)  # above every measured prediction
    assert guide.nothing_left(points, bar_rps=320.0 * 1.1) is None
    # A near-best prediction with a bar the line's estimate clears keeps searching.
    guide.predictions.pop(knobs[4])
    assert guide.nothing_left(points, bar_rps=300.0) is None


def text_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, extra: str = ""
) -> list[str]:
    """A simulated text model: variable-length inputs, ten lengths in random order, each its
    own shape; 10 ms a batch + 0.5 ms an item on a device every instance shares. Requests of
    different shapes never share a batch unless the inputs allow ragged batches."""
    repo = tmp_path / "repo"
    model = write_sim_model(repo, "text", 10.0, per_item_ms=0.5, max_batch_size=8)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace("[ 16 ]", "[ -1 ]"))
    mix = RequestMix("tokens", tuple(RequestKind(10 * (i + 1), 0.1, i) for i in range(10)))
    plain = virtual._profile

    def keyed(config: Any, repository: Any, largest: int) -> Profile:
        return replace(plain(config, repository, largest), mix=mix)

    monkeypatch.setattr(virtual, "_profile", keyed)
    monkeypatch.setattr("analyzer.search.strategy.sim_workers", lambda: 1)
    scenario = tmp_path / "text.toml"
    scenario.write_text(SCENARIO.format(model="text", p99_ms=100.0, extra=extra, strategy=strategy))
    return ["--scenario", str(scenario), "--model-repository", str(repo)]


def test_batches_that_never_form_end_a_tpe_search_and_the_run_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch, capsys, *text_model(tmp_path, monkeypatch, "tpe"), "--run-dir", str(run_dir)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "nothing_left_to_gain"
    assert summary["trials"]["complete"] <= 6
    batching = summary["batching"]
    assert batching["inert"] and all(t["mean_batch_size"] < 1.2 for t in batching["trials"])
    assert all(t["max_batch_size"] >= 2 for t in batching["trials"])
    assert "batches did not form" in done.stdout and "batches do not form" in done.stdout
    assert "batches did not form" in (run_dir / "report.html").read_text()


def test_ragged_batches_searched_make_batches_form_and_the_answer_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    flags = text_model(tmp_path, monkeypatch, "predict", 'ragged_batch = "search"')
    done = virtual_sweep(monkeypatch, capsys, *flags, "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    best = summary["best"]["config"]
    assert best["ragged_batch"] is True and best["max_batch_size"] >= 4
    assert summary["best"]["throughput_rps"] > 2 * summary["baseline"]["throughput_rps"]
    assert "allow_ragged_batch" in summary["recommendation"]["detail"]
    assert "recommended: trial" in done.stdout and "allow_ragged_batch" in done.stdout
    written = parse_config_text((run_dir / "best" / "config.pbtxt").read_text())
    assert [i.allow_ragged_batch for i in written.input] == [True]


def test_batches_that_cannot_form_are_said_before_trial_0_and_only_instance_counts_are_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The probe's data says it: one request in ten has the shape of the one ahead, and the
    space never allows ragged batches. The console says so before trial 0, with the two ways
    out, and the search measures one config per instance count at most."""
    run_dir = tmp_path / "run"
    flags = text_model(tmp_path, monkeypatch, "predict")
    done = virtual_sweep(monkeypatch, capsys, *flags, "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())  # the note may wrap
    said = out.index("note: batches cannot form")
    assert said < out.index("trial 0 (predict)")
    note = out[said : out.index("[", said)]
    assert "10% of arrivals have the shape of the request ahead" in note
    assert "--ragged-batch search" in note and "--pad-buckets auto" in note
    summary = load_summary(run_dir)
    trials = [
        json.loads(p.read_text()) for p in sorted((run_dir / "trials").glob("0*/measurement.json"))
    ]
    counts = [t["config"]["instance_count"] for t in trials]
    assert 1 <= len(trials) <= 2 and len(set(counts)) == len(counts)
    assert summary["stop_reason"] in ("prediction", "nothing_left_to_gain")
    # The search predicted (and so could choose) one config per instance count only.
    predicted = json.loads((run_dir / "predictions.json").read_text())["configs"]
    assert sorted(c["config"]["instance_count"] for c in predicted) == [1, 2]
