"""Pure helpers of benchmarks/time_to_answer.py: quality ratio, prediction error, MA's CSV and checkpoint."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location(
        "time_to_answer", ROOT / "benchmarks" / "time_to_answer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("time_to_answer", module)
    spec.loader.exec_module(module)
    return module


tta = _load()

# Model Analyzer 1.58's metrics-model-inference.csv, default inference_output_fields.
MA_CSV = """\
Model,Batch,Concurrency,Model Config Path,Instance Group,Max Batch Size,Satisfies Constraints,\
Throughput (infer/sec),p99 Latency (ms)
resnet50,1,16,resnet50_config_3,2:CPU,8,Yes,310.5,41.2
resnet50,1,64,resnet50_config_4,2:CPU,16,No,420.0,95.1
resnet50,1,8,resnet50_config_0,1:CPU,1,Yes,90.0,12.0
resnet50,1,32,resnet50_config_default,1:CPU,32,Yes,250.0,58.0
"""


def test_quality_is_the_config_capacity_over_the_best_of_the_space() -> None:
    a, b, outside = (1, 0, (), 1), (8, 2000, (), 2), (32, 0, (), 1)
    capacities = {a: 100.0, b: 400.0, outside: 800.0}
    assert tta.quality(capacities, [a, b], a) == pytest.approx(0.25)
    assert tta.quality(capacities, [a, b], b) == pytest.approx(1.0)
    # A config outside the space is judged against the space's best, not its own.
    assert tta.quality(capacities, [a, b], outside) == pytest.approx(2.0)
    assert tta.quality(capacities, [a, b], (2, 0, (), 1)) is None
    assert tta.quality({}, [a, b], a) is None


def test_relative_errors_and_their_median_skip_unmeasured_configs() -> None:
    errors = tta.relative_errors([(110.0, 100.0), (50.0, 100.0), (10.0, 0.0), (90.0, 100.0)])
    assert errors == pytest.approx([0.1, 0.5, 0.1])
    stats = tta.error_stats(errors)
    assert stats["n"] == 3
    assert stats["median"] == pytest.approx(0.1)
    assert stats["worst"] == pytest.approx(0.5)
    assert tta.error_stats([]) == {"n": 0, "median": None, "worst": None}


def test_the_predict_runs_are_summarised_against_each_peer() -> None:
    tools = {
        "predict": {"wall_s": 30.0, "trials": {"complete": 1}, "quality": 1.0},
        "predict-2": {"wall_s": 90.0, "trials": {"complete": 5}, "quality": 0.96},
        "predict-3": {"wall_s": 40.0, "trials": {"complete": 2}, "quality": 0.98},
        "tpe": {"wall_s": 120.0},
        "ma": {"wall_s": 48.0},
        "before": {"wall_s": 400.0},
        "extra-ma": {"wall_s": 999.0},
    }
    runs = tta.predict_runs(tools)
    assert runs["n"] == 3 and runs["trials"] == [1, 5, 2]
    assert runs["wall_s"] == {"median": 40.0, "min": 30.0, "max": 90.0}
    assert runs["over_tpe"]["median"] == pytest.approx(1 / 3)
    assert runs["over_ma"]["max"] == pytest.approx(90 / 48)
    assert runs["over_before"]["min"] == pytest.approx(30 / 400)
    assert runs["quality_min"] == pytest.approx(0.96)
    assert tta.predict_runs({"tpe": {"wall_s": 1.0}}) is None


def test_model_analyzer_csv_parsed_and_its_best_config_meets_the_goal() -> None:
    rows = tta.parse_ma_metrics(MA_CSV)
    assert [r["name"] for r in rows] == [
        "resnet50_config_3",
        "resnet50_config_4",
        "resnet50_config_0",
        "resnet50_config_default",
    ]
    assert rows[0]["instance_count"] == 2
    assert rows[0]["max_batch_size"] == 8
    assert rows[0]["satisfies"] is True
    assert rows[1]["satisfies"] is False
    best = tta.ma_recommendation(rows, p99_ms=60.0)
    assert best is not None
    assert best["name"] == "resnet50_config_3"  # config_4 is faster but misses the goal
    assert tta.ma_recommendation(rows, p99_ms=5.0) is None


def test_config_key_reads_summary_and_trial_configs_alike() -> None:
    config = {
        "max_batch_size": 16,
        "max_queue_delay_us": 2000,
        "preferred_batch_size": [8, 16],
        "instance_count": 2,
    }
    assert tta.config_key(config) == (16, 2000, (8, 16), 2)
    assert tta.config_key({"max_batch_size": 4}) == (4, 0, (), 1)


def test_scenario_written_by_the_harness_reads_back() -> None:
    text = tta.dump_toml(
        {"space": {"max_batch_size": [1, 16], "preferred_batch_size": "none"}, "goals": {}},
        {"objective": "throughput"},
    )
    doc = tomllib.loads(text)
    assert doc["objective"] == "throughput"
    assert doc["space"] == {"max_batch_size": [1, 16], "preferred_batch_size": "none"}


def test_an_earlier_versions_scenario_gets_the_same_space_goals_and_budgets() -> None:
    # "before" runs an earlier perfsweep on its own scenario file (no [search] section there).
    old = (ROOT / "scenarios" / "resnet50.sim.toml").read_text().split("[search]")[0]
    for quick in (False, True):
        doc = tta.scenario_doc("triton", quick, old)
        current = tta.scenario_doc("triton", quick)
        assert "search" in current and "search" not in doc
        assert doc == {k: v for k, v in current.items() if k != "search"}
        assert doc["goals"]["p99_ms"] == tta.TRITON_P99_MS
        assert doc["model"] == {"name": "gpulike"}


def _variant(name: str, mbs: int, count: int, batching: dict | None, points: list) -> dict:
    model_config = {"name": "m", "maxBatchSize": mbs, "instanceGroup": [{"count": count}]}
    if batching is not None:
        model_config["dynamicBatching"] = batching
    run_config = {"_model_run_configs": [{"_model_config_variant": {"model_config": model_config}}]}
    measurements = {
        f"{name} --concurrency-range={c}": {
            "_model_config_measurements": [
                {
                    "_model_specific_pa_params": {"concurrency-range": c},
                    "_non_gpu_data": [
                        ["perf_latency_p99", {"_value": p99, "_timestamp": 0}],
                        ["perf_throughput", {"_value": rps, "_timestamp": 0}],
                    ],
                }
            ]
        }
        for c, rps, p99 in points
    }
    return {name: [run_config, measurements]}


def test_model_analyzer_checkpoint_gives_every_measurement_with_its_config() -> None:
    doc = {
        "ResultManager.results": {
            "_results": {
                "m": {
                    **_variant("m_config_default", 32, 1, None, [(64, 130.0, 660.0)]),
                    **_variant("m_config_5", 4, 2, {}, [(8, 400.0, 30.0), (16, 590.0, 39.0)]),
                    **_variant(
                        "m_config_6", 8, 2, {"maxQueueDelayMicroseconds": "100"}, [(32, 680, 66)]
                    ),
                }
            }
        }
    }
    rows = tta.parse_ma_checkpoint(doc, "m")
    assert len(rows) == 4
    default = rows[0]
    assert (default["max_batch_size"], default["dynamic_batching"]) == (32, False)
    assert rows[3]["max_queue_delay_us"] == 100
    best = tta.ma_recommendation(rows, p99_ms=60.0)
    assert best is not None
    assert (best["name"], best["concurrency"], best["instance_count"]) == ("m_config_5", 16, 2)
    assert tta.parse_ma_checkpoint(doc, "other") == []


def test_repeated_grids_give_each_config_its_median_and_report_their_spread() -> None:
    cfg = {
        "max_batch_size": 8,
        "max_queue_delay_us": 0,
        "preferred_batch_size": [],
        "instance_count": 1,
    }
    other = {**cfg, "instance_count": 2}
    runs = [
        {"wall_s": 10.0, "exit_code": 0, "measured": [
            {"config": cfg, "capacity_rps": 100.0, "bracketed": True},
            {"config": other, "capacity_rps": 300.0, "bracketed": True},
        ]},
        {"wall_s": 12.0, "exit_code": 0, "measured": [
            {"config": cfg, "capacity_rps": 120.0, "bracketed": True},
            {"config": other, "capacity_rps": None, "bracketed": False},
        ]},
        {"wall_s": 11.0, "exit_code": 0, "measured": [
            {"config": cfg, "capacity_rps": 90.0, "bracketed": True},
        ]},
    ]  # fmt: skip
    grid, capacities, bracketed, repeats = tta.combine_grids(runs)
    key, key2 = tta.config_key(cfg), tta.config_key(other)
    assert grid["wall_s"] == 33.0
    assert capacities == {key: 100.0, key2: 300.0}
    assert bracketed == {key: True, key2: False}  # bracketed only when every run bracketed it
    noise = tta.grid_noise(repeats)
    assert noise == {"configs": 1, "median_spread": 0.3, "max_spread": 0.3}
    assert tta.grid_noise({key2: [300.0]}) is None


def test_the_slowed_sim_profile_doubles_every_duration(tmp_path: Path) -> None:
    from reference_server.zoo.profiles import resolve_profile

    (tmp_path / "device.toml").write_text(tta.slowed_profile(2.0))
    slow = resolve_profile("device.toml", tmp_path)
    bundled = resolve_profile("resnet50_sim")
    for b in (1, 3, 8, 16, 32, 40):
        assert slow.device.ms(b) == pytest.approx(2 * bundled.device.ms(b))
        assert slow.host_pre.ms(b) == pytest.approx(2 * bundled.host_pre.ms(b))
        assert slow.host_post.ms(b) == pytest.approx(2 * bundled.host_post.ms(b))
    assert slow.jitter == bundled.jitter and slow.gpu == bundled.gpu
    assert tta.scenario_doc("sim", False)["goals"]["p99_ms"] == tta.SIM_SLOWDOWN * 60.0
