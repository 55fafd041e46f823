"""Pure helpers of benchmarks/mix_vs_model_analyzer.py: Model Analyzer's results of two models
profiled together (its table and its checkpoint), its pick, a variant as the model's config."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

import benchmarks.mix_vs_model_analyzer as bench

MODELS = ("rank", "tag")

# Model Analyzer 1.58's metrics-model-inference.csv of two models profiled concurrently: one row
# per combination, best first; a multi-model cell joins one value per model (result_utils'
# format_for_csv), a figure leads with the combination's own aggregate.
MA_CSV = """\
Model,Batch,Concurrency,Model Config Path,Instance Group,Max Batch Size,Satisfies Constraints,\
Throughput (infer/sec),p99 Latency (ms)
"rank,tag","1,1","16,32","rank_config_2,tag_config_3","1:CPU,1:CPU","32,32",Yes,\
"610.4, [200.1,410.3]","350.0, [350.0,38.5]"
"rank,tag","1,1","8,8","rank_config_0,tag_config_0","2:CPU,1:CPU","8,4",No,\
"300.0, [150.0,150.0]","90.0, [90.0,55.0]"
"""


def _measurement(rank_rps: float, rank_p99: float, tag_rps: float, tag_p99: float) -> dict:
    def model(rps: float, p99: float) -> dict:
        return {
            "_non_gpu_data": [
                ["perf_throughput", {"_value": rps}],
                ["perf_latency_p99", {"_value": p99}],
            ],
            "_model_specific_pa_params": {"concurrency-range": 8},
        }

    return {"_model_config_measurements": [model(rank_rps, rank_p99), model(tag_rps, tag_p99)]}


def _variant(name: str, max_batch: int, count: int) -> dict:
    return {
        "_model_config_variant": {
            "variant_name": name,
            "model_config": {
                "name": name,
                "backend": "python",
                "maxBatchSize": max_batch,
                "dynamicBatching": {},
                "instanceGroup": [{"count": count, "kind": "KIND_CPU"}],
            },
        }
    }


CHECKPOINT = {
    "ResultManager.results": {
        "_results": {
            "rank,tag": {
                "rank_config_0,tag_config_0": [
                    {
                        "_model_run_configs": [
                            _variant("rank_config_0", 8, 2),
                            _variant("tag_config_0", 4, 1),
                        ]
                    },
                    {"a": _measurement(150.0, 90.0, 150.0, 55.0)},
                ],
                "rank_config_2,tag_config_3": [
                    {
                        "_model_run_configs": [
                            _variant("rank_config_2", 32, 1),
                            _variant("tag_config_3", 32, 1),
                        ]
                    },
                    {
                        "a": _measurement(200.1, 350.0, 410.3, 38.5),
                        "b": _measurement(300.0, 500.0, 500.0, 80.0),
                    },
                ],
            },
            "rank": {"rank_config_default": [{}, {}]},
        }
    }
}

GOALS = {"rank": 400.0, "tag": 40.0}


def test_a_concurrent_row_gives_each_model_its_variant_and_figures_in_the_table_order() -> None:
    rows = bench.parse_concurrent_rows(MA_CSV, MODELS)
    assert [r["variants"] for r in rows] == [
        {"rank": "rank_config_2", "tag": "tag_config_3"},
        {"rank": "rank_config_0", "tag": "tag_config_0"},
    ]
    assert [r["satisfies"] for r in rows] == [True, False]
    assert rows[0]["throughput_rps"] == {"rank": 200.1, "tag": 410.3}
    assert rows[0]["p99_ms"] == {"rank": 350.0, "tag": 38.5}


def test_rows_of_other_models_are_left_out() -> None:
    assert bench.parse_concurrent_rows(MA_CSV, ("rank",)) == []


def test_the_checkpoint_holds_each_combination_with_every_measurement_per_model() -> None:
    results = bench.checkpoint_results(CHECKPOINT, MODELS)
    assert set(results) == {"rank_config_0,tag_config_0", "rank_config_2,tag_config_3"}
    best = results["rank_config_2,tag_config_3"]
    assert best["configs"]["tag"]["maxBatchSize"] == 32
    assert [p["p99_ms"]["tag"] for p in best["measurements"]] == [38.5, 80.0]


def test_model_analyzer_picks_its_tables_first_passing_row() -> None:
    rows = bench.parse_concurrent_rows(MA_CSV, MODELS)
    results = bench.checkpoint_results(CHECKPOINT, MODELS)
    pick = bench.ma_pick(list(reversed(rows)), results, GOALS)
    assert pick == ("rank_config_2,tag_config_3", "its table's first passing row")


def test_without_a_table_the_pick_is_the_checkpoints_best_measurement_that_meets_every_goal() -> (
    None
):
    results = bench.checkpoint_results(CHECKPOINT, MODELS)
    # rank_config_0's 300 req/s misses tag's goal (55 ms); rank_config_2's first point meets both.
    assert bench.ma_pick([], results, GOALS) == (
        "rank_config_2,tag_config_3",
        "the checkpoint's best passing measurement",
    )
    assert bench.ma_pick([], results, {"rank": 400.0, "tag": 10.0}) is None


def test_a_variant_becomes_the_models_own_config() -> None:
    results = bench.checkpoint_results(CHECKPOINT, MODELS)
    config = results["rank_config_0,tag_config_0"]["configs"]["rank"]
    parsed = text_format.Parse(bench.variant_pbtxt(config, "rank"), mc.ModelConfig())
    assert parsed.name == "rank"
    assert parsed.max_batch_size == 8
    assert parsed.instance_group[0].count == 2
    assert bench.knobs(config) == {
        "max_batch_size": 8,
        "dynamic_batching": True,
        "max_queue_delay_us": 0,
        "preferred_batch_size": [],
        "instance_count": 2,
    }
