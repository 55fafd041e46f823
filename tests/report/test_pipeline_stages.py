"""A pipeline's stages at its operating point: the breakdown the report and the console show,
the limiting stage, the window deltas and their JSON (pure: no server)."""

from __future__ import annotations

from dataclasses import replace

from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import JointKnobs
from analyzer.measure.measurement import ServerView
from analyzer.report.record import ServerBreakdown
from analyzer.report.series import limiting_stage, stage_breakdown
from analyzer.report.verdict import explain
from analyzer.rundir.trial_record import TrialRecord
from analyzer.target.server_stats import (
    ServerSnapshot,
    StatsSnapshot,
    combine_views,
    server_view,
)

KNOBS = JointKnobs((("pre", Knobs(8)), ("infer", Knobs(16, 0, (), 2)), ("post", Knobs(8))))


def _stats(executions: int, requests: int, compute_ms: float, queue_ms: float) -> StatsSnapshot:
    ns = int(compute_ms * 1e6) * requests
    return StatsSnapshot(
        inference_count=requests,
        execution_count=executions,
        durations={
            "success": (requests, 0),
            "queue": (requests, int(queue_ms * 1e6) * requests),
            "compute_infer": (requests, ns),
        },
    )


def test_stage_views_are_window_deltas_and_survive_json_and_combining() -> None:
    before = ServerSnapshot(StatsSnapshot(stages={"infer": _stats(10, 40, 20.0, 5.0)}), None)
    after = ServerSnapshot(StatsSnapshot(stages={"infer": _stats(20, 120, 20.0, 5.0)}), None)
    view = server_view(before, after)
    assert view is not None
    infer = view.stages["infer"]
    assert infer.execution_count == 10 and infer.inference_count == 80
    assert infer.avg_batch_size == 8.0
    assert ServerView.from_dict(view.to_dict()) == view
    assert "stages" not in ServerView().to_dict()  # one model's views read as before
    both = combine_views([view, view])
    assert both is not None and both.stages["infer"].execution_count == 20


def test_the_busiest_stage_limits_the_pipeline() -> None:
    record = TrialRecord(number=3, source="search", state="complete", config=KNOBS)
    server = ServerView(
        stages={
            # 100 executions of 2 ms over 10 s on one instance: 2 % busy.
            "pre": ServerView(execution_count=100, inference_count=100, compute_infer_us=2000),
            # 500 of 30 ms over 10 s on two instances: 75 % busy.
            "infer": ServerView(
                execution_count=500,
                inference_count=4000,
                avg_batch_size=8.0,
                compute_infer_us=30000,
                queue_us=9000,
            ),
            "post": ServerView(execution_count=500, inference_count=4000, compute_infer_us=1000),
        }
    )
    rows = stage_breakdown(record, server, duration_s=10.0)
    assert [r.name for r in rows] == ["pre", "infer", "post"]
    infer = rows[1]
    assert infer.instances == 2 and infer.busy_pct == 75.0 and infer.avg_batch_size == 8.0
    assert rows[0].busy_pct == 2.0 and limiting_stage(rows) == "infer"
    # One model's record has no stages.
    plain = TrialRecord(number=1, source="search", state="complete", config=Knobs(8))
    assert stage_breakdown(plain, server, 10.0) == ()

    def breakdown(role: str, busy: float) -> ServerBreakdown:
        stages = tuple(replace(r, busy_pct=busy) if r.name == "infer" else r for r in rows)
        return ServerBreakdown(
            role, 3, 100.0, 0, 0, 0, 0, 1.0, {}, 1, 1, None, stages, limiting_stage(stages)
        )

    lines = explain([breakdown("baseline", 40.0), breakdown("best", 75.0)])
    assert any(line.startswith("Stage infer (batch, queue per request") for line in lines)
    assert "75 % vs 8.00, 9.00 ms, 40 %" in " ".join(lines)
    assert lines[-1].startswith(
        "The stage that limits the pipeline's capacity at the best config: infer"
    )
    assert not any(line.startswith("Batching:") for line in lines)  # an ensemble's is one request
