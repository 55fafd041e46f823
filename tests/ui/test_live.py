"""The dashboard's pure parts: exact windows, server deltas across reloads, the config form,
load profiles, target settings and the exposure rule (no sockets, no gevent)."""

from __future__ import annotations

import argparse
import json
import random
import re

import numpy as np
import pytest

from analyzer.errors import InputError
from analyzer.load.recorder import Recorder, Tick
from analyzer.load.web import profiles
from analyzer.load.web.launcher import UiOptions, locust_commands
from analyzer.load.web.live import (
    ClientWindow,
    ServerWindow,
    TokenGoals,
    dashboard,
    parse_config_request,
    parse_engine_request,
    restarted,
    table_rows,
    tick_point,
)
from analyzer.load.web.options import (
    TargetSettings,
    exposure_problem,
    is_loopback,
    login_from_env,
    request_problem,
)
from analyzer.measure.tokens import StreamRecord
from analyzer.target.server_stats import MetricsSnapshot, ServerSnapshot, StatsSnapshot
from reference_server.ready import last_ready


def _tick(latencies_s: list[float], errors: int = 0) -> Tick:
    rec = Recorder()
    for i, lat in enumerate(latencies_s):
        rec.dispatched_one(0.0)
        rec.done(lat, lat, "HTTP 503: busy" if i < errors else None)
    return Tick.merge([rec.take_tick()])


def _nearest_rank_ms(values_ms: np.ndarray, p: float) -> float:
    """The percentile definition HDR (and perfsweep) use: the value at rank round(p% of n)."""
    rank = max(int(p * values_ms.size / 100 + 0.5), 1)
    return float(np.sort(values_ms)[rank - 1])


def _close(reported_ms: float, true_ms: float) -> bool:
    # HDR with 3 significant figures: within 0.1 %, plus the 1 us recording resolution.
    return abs(reported_ms - true_ms) <= 1e-3 * true_ms + 1e-3


def test_client_window_percentiles_are_exact_and_roll() -> None:
    rng = random.Random(7)
    seconds = [[rng.lognormvariate(-4.5, 0.6) for _ in range(400)] for _ in range(15)]
    window = ClientWindow(window_s=10)
    for i, lat in enumerate(seconds):
        window.add(100.0 + i, _tick(lat))
    doc = window.summary(114.0)
    # The window holds the last 10 seconds only; since_start holds all 15.
    in_window = np.concatenate(seconds[5:]) * 1000.0
    everything = np.concatenate(seconds) * 1000.0
    assert doc["window"]["requests"] == in_window.size
    assert doc["since_start"]["requests"] == everything.size
    for key, q in (("p50_ms", 50), ("p99_ms", 99)):
        assert _close(doc["window"][key], _nearest_rank_ms(in_window, q))
        assert _close(doc["since_start"][key], _nearest_rank_ms(everything, q))
    assert doc["window"]["throughput_rps"] == pytest.approx(in_window.size / 10.0, rel=1e-3)
    window.reset()
    assert window.summary(200.0)["since_start"]["requests"] == 0


def test_client_window_counts_error_kinds() -> None:
    window = ClientWindow()
    window.add(1.0, _tick([0.01] * 10, errors=3))
    doc = window.summary(1.0)
    assert doc["window"]["errors"] == 3
    assert doc["window"]["error_kinds"] == {"HTTP 503: busy": 3}
    assert doc["window"]["throughput_rps"] == pytest.approx(7.0)


def _snap(
    inferences: int, executions: int, batches: dict[int, int], queue_ns: int, failures: int = 0
) -> ServerSnapshot:
    durations = {
        "success": (inferences, 0),
        "fail": (0, 0),
        "queue": (inferences, queue_ns),
        "compute_input": (inferences, 0),
        "compute_infer": (inferences, 2_000 * inferences),
        "compute_output": (inferences, 0),
    }
    return ServerSnapshot(
        stats=StatsSnapshot(inferences, executions, durations, batches),
        metrics=MetricsSnapshot({"REJECTED": failures, "OTHER": 0}, pending_requests=2),
    )


def test_server_window_deltas_and_reload() -> None:
    window = ServerWindow(window_s=10)
    assert window.add(0.0, _snap(0, 0, {}, 0)) is None
    view = window.add(1.0, _snap(40, 10, {4: 10}, 40 * 500_000, failures=1))
    assert view is not None
    assert view.avg_batch_size == pytest.approx(4.0)
    assert view.queue_us == pytest.approx(500.0)
    assert view.compute_infer_us == pytest.approx(2.0)
    assert view.failures_by_reason["REJECTED"] == 1
    window.add(2.0, _snap(100, 25, {4: 25}, 100 * 500_000, failures=1))
    summary = window.window_view()
    assert summary is not None and summary.batch_sizes == {4: 25}
    # A config change reloads the model: counters restart at 0; no negative deltas appear.
    view = window.add(3.0, _snap(6, 3, {2: 3}, 6 * 100_000))
    assert window.reloads == 1
    assert view is not None and view.batch_sizes == {2: 3} and view.avg_batch_size == 2.0
    assert view.failures_by_reason["REJECTED"] == 0
    assert restarted(_snap(5, 5, {1: 5}, 0).stats, _snap(5, 5, {1: 4}, 0).stats)


def _doc() -> dict:
    client = ClientWindow()
    client.add(1.0, _tick([0.004] * 50))
    server = ServerWindow()
    server.add(0.0, _snap(0, 0, {}, 0))
    server.add(1.0, _snap(50, 20, {2: 15, 4: 5}, 50 * 300_000))
    config = {
        "max_batch_size": 8,
        "max_queue_delay_us": 1000,
        "preferred_batch_size": [4],
        "instance_count": 1,
    }
    return dashboard(
        now=1.0,
        model="m",
        target="http://127.0.0.1:1",
        state="running",
        users=2,
        client=client,
        server=server,
        history=[],
        config=config,
        errors={},
    )


def test_dashboard_document_and_table_rows() -> None:
    doc = _doc()
    assert doc["server"]["window"]["avg_batch_size"] == pytest.approx(2.5)
    assert doc["server"]["window"]["batch_share"] == {"2": 0.75, "4": 0.25}
    assert doc["server"]["totals"]["batch_executions"] == {"2": 15, "4": 5}
    assert doc["server"]["pending_requests"] == 2
    rows = {r["metric"]: r["value"] for r in table_rows(doc)}
    assert rows["average batch size"] == "2.50"
    assert rows["executions by batch size"] == "2:15 4:5"
    assert rows["queue time / request"] == "300 us"
    assert rows["pending requests"] == "2"
    assert "preferred [4]" in rows["model config"]


CURRENT = {
    "max_batch_size": 8,
    "max_queue_delay_us": 100,
    "preferred_batch_size": [],
    "instance_count": 1,
}


def test_config_request_merges_and_parses() -> None:
    out = parse_config_request(
        {"max_queue_delay_us": "2500", "preferred_batch_size": "2, 8 4"}, CURRENT
    )
    assert out == {**CURRENT, "max_queue_delay_us": 2500, "preferred_batch_size": [8, 4, 2]}
    assert parse_config_request({"preferred_batch_size": ""}, CURRENT)["preferred_batch_size"] == []
    baseline = {**CURRENT, "dynamic_batching": False}
    assert "dynamic_batching" not in parse_config_request({"max_queue_delay_us": 5}, baseline)
    assert parse_config_request({"instance_count": 2}, baseline)["dynamic_batching"] is False


@pytest.mark.parametrize(
    ("posted", "message"),
    [
        ({"max_queue_delay": 5}, "unknown config field"),
        ({"max_batch_size": "x"}, "must be an integer"),
        ({"instance_count": 0}, "between 1 and 64"),
        ({"preferred_batch_size": [16]}, "exceed max_batch_size 8"),
        ({"max_batch_size": True}, "must be an integer"),
        ([1, 2], "JSON object"),
    ],
)
def test_config_request_refuses_bad_input(posted: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_config_request(posted, CURRENT)


def test_profiles() -> None:
    assert profiles.steady(123.0, 7) == 7
    assert [profiles.ramp(t, 10, 10.0) for t in (0, 1, 5, 10, 30)] == [1, 1, 5, 10, 10]
    calm = [profiles.spike(t, 4, 10.0, 3.0, 2.0) for t in range(0, 8)]
    burst = [profiles.spike(t, 4, 10.0, 3.0, 2.0) for t in (8, 9, 18)]
    assert set(calm) == {4} and set(burst) == {12}
    day = [profiles.diurnal(t, 100, 60.0) for t in range(0, 61, 15)]
    assert day == [20, 60, 100, 60, 20]


def test_target_settings_follow_triton_port_layout() -> None:
    s = TargetSettings.from_locust("http://127.0.0.1:8000/", None)
    assert (s.http_address, s.grpc_url, s.metrics_url) == (
        "127.0.0.1:8000",
        "127.0.0.1:8001",
        "http://127.0.0.1:8002/metrics",
    )
    opts = argparse.Namespace(
        triton_model="m", grpc_url="h:9", metrics_url="", rate_per_user=5.0, arrival="constant"
    )
    s = TargetSettings.from_locust("127.0.0.1:7000", opts)
    assert (s.model, s.grpc_url, s.rate_per_user, s.arrival) == ("m", "h:9", 5.0, "constant")
    assert s.metrics_url == "http://127.0.0.1:7002/metrics"
    with pytest.raises(ValueError, match="Host field"):
        TargetSettings.from_locust("", None)


def test_exposure_rule() -> None:
    creds = ("perfsweep", "pw")
    assert exposure_problem("127.0.0.1", False, None) == ""
    assert is_loopback("localhost") and not is_loopback("") and not is_loopback("0.0.0.0")
    assert "refusing to serve the dashboard on 0.0.0.0" in exposure_problem("0.0.0.0", False, None)
    assert "all interfaces" in exposure_problem("", False, None)
    assert exposure_problem("0.0.0.0", True, creds) == ""
    assert "PERFSWEEP_UI_PASSWORD" in exposure_problem("0.0.0.0", True, None)
    assert login_from_env({"PERFSWEEP_UI_PASSWORD": "pw"}) == creds
    assert login_from_env({}) is None


def test_request_guard_against_other_pages() -> None:
    own = "127.0.0.1:8089"
    assert request_problem("POST", own, f"http://{own}", "127.0.0.1") == ""
    assert request_problem("POST", own, None, "127.0.0.1") == ""  # scripts, curl: no Origin
    assert request_problem("GET", own, "http://evil.example", "127.0.0.1") == ""
    assert "cross-origin POST" in request_problem("POST", own, "http://evil.example", "127.0.0.1")
    assert "cross-origin" in request_problem("POST", own, "null", "127.0.0.1")
    # DNS rebinding: the attacker's name resolves to 127.0.0.1.
    assert "loopback host names" in request_problem("GET", "evil.example:8089", None, "127.0.0.1")
    assert request_problem("GET", "localhost:8089", None, "127.0.0.1") == ""
    assert request_problem("GET", "dash.corp:8089", None, "0.0.0.0") == ""


def test_ui_options_refuse_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERFSWEEP_UI_PASSWORD", raising=False)
    with pytest.raises(InputError, match="refusing"):
        UiOptions(web_host="0.0.0.0").check()
    with pytest.raises(InputError, match="workers"):
        UiOptions(workers=0).check()
    monkeypatch.setenv("PERFSWEEP_UI_PASSWORD", "pw")
    UiOptions(web_host="0.0.0.0", web_login=True).check()


@pytest.mark.usefixtures("serves")
def test_locust_command_lines() -> None:
    master, workers = locust_commands(
        UiOptions(workers=2, web_port=0), "http://127.0.0.1:5", "127.0.0.1:6", None
    )
    assert master[master.index("--host") + 1] == "http://127.0.0.1:5"
    assert master[master.index("--web-host") + 1] == "127.0.0.1"
    assert "--class-picker" in master and "--master" in master
    assert master[master.index("--master-bind-host") + 1] == "127.0.0.1"
    port = master[master.index("--master-bind-port") + 1]
    assert len(workers) == 2 and all(w[w.index("--master-port") + 1] == port for w in workers)
    assert "--metrics-url" not in master
    single, none = locust_commands(UiOptions(), "http://h:1", None, "http://h:3/metrics")
    assert none == [] and "--master" not in single and "--metrics-url" in single
    assert "--perfsweep-input" not in single  # random data: nothing to pass
    # Request data reaches the master and every worker (each builds its own requests).
    inputs = {"batch_size": 4, "shapes": {"IDS": [128]}}
    master, workers = locust_commands(UiOptions(workers=2, inputs=inputs), "http://h:1", None, None)
    for line in (master, *workers):
        assert json.loads(line[line.index("--perfsweep-input") + 1]) == inputs
    opts = argparse.Namespace(perfsweep_input=json.dumps(inputs))
    assert dict(TargetSettings.from_locust("h:1", opts).inputs) == inputs


def test_managed_addresses_read_the_last_ready_line() -> None:
    # What ManagedServer.addresses (and so the dashboard's gRPC and metrics URLs) is read with.
    log = (
        "perfsweep reference server ready: http=127.0.0.1:1 grpc=127.0.0.1:2 metrics=127.0.0.1:3\n"
        "--- restart\n"
        "perfsweep reference server ready: http=127.0.0.1:4 grpc=127.0.0.1:5 metrics=127.0.0.1:6\n"
    )
    addresses = last_ready(log)
    assert addresses is not None
    assert (addresses.grpc_url, addresses.metrics_url) == (
        "127.0.0.1:5",
        "http://127.0.0.1:6/metrics",
    )
    assert last_ready("") is None


# -- token streams (generative users) ----------------------------------------------------------


def _stream_tick(streams: list[tuple[float, float, int]], failed: int = 0) -> Tick:
    """One second of token streams, each (TTFT s, gap between tokens s, tokens); the first
    ``failed`` streams failed (their tokens kept)."""
    rec = Recorder()
    for i, (ttft, gap, tokens) in enumerate(streams):
        record = StreamRecord(0.0, 0.0, input_tokens=16)
        for k in range(tokens):
            record.token(ttft + k * gap)
        record.end = ttft + (tokens - 1) * gap
        record.failed = i < failed
        rec.dispatched_one(0.0)
        rec.stream_done(
            record, record.end, record.end, "stream closed early" if i < failed else None
        )
    return Tick.merge([rec.take_tick()])


def test_token_streams_in_the_window_give_ttft_itl_tokens_and_goodput() -> None:
    window = ClientWindow(window_s=10)
    # Second 1: fast streams; second 2: two slow first tokens and one failed stream.
    window.add(101.0, _stream_tick([(0.050, 0.010, 8)] * 4))
    window.add(102.0, _stream_tick([(0.400, 0.010, 8), (0.400, 0.030, 8), (0.050, 0.010, 8)], 1))
    doc = window.summary(102.0, TokenGoals(ttft_p99_ms=100.0, itl_p99_ms=20.0))
    t = doc["window"]["tokens"]
    assert (t["streams"], t["failed_streams"], t["output_tokens"]) == (7, 1, 56)
    assert _close(t["ttft_p50_ms"], 50.0) and _close(t["ttft_p99_ms"], 400.0)
    # ITL over tokens: 7 gaps a stream, 10 ms but for one stream's 30 ms; its mean ITL is 30 ms.
    assert _close(t["itl_p50_ms"], 10.0) and _close(t["itl_p99_ms"], 30.0)
    assert _close(t["mean_itl_p99_ms"], 30.0)
    assert t["output_tokens_per_s"] == pytest.approx(56 / 2.0)
    # Good: the 4 fast streams and the last one of second 2 (the failed one is not, nor the
    # slow first tokens) over the 2 s the window spans.
    assert t["goodput_rps"] == pytest.approx(5 / 2.0)
    assert t["goals"] == {"ttft_p99_ms": 100.0, "itl_p99_ms": 20.0}
    assert doc["since_start"]["tokens"]["streams"] == 7
    # No goals: no goodput.
    assert window.summary(102.0)["window"]["tokens"]["goodput_rps"] is None


def test_requests_answered_once_have_no_token_figures() -> None:
    window = ClientWindow()
    window.add(1.0, _tick([0.004] * 5))
    assert window.summary(1.0)["window"]["tokens"] is None
    point = tick_point(1.0, _tick([0.004] * 5), None)
    assert (point.ttft_p99_ms, point.itl_p99_ms, point.tokens_per_s) == (None, None, None)


def test_a_second_of_streams_is_a_chart_point_and_table_rows() -> None:
    tick = _stream_tick([(0.050, 0.010, 8), (0.080, 0.020, 4)])
    point = tick_point(5.0, tick, None).to_dict()
    assert _close(point["ttft_p99_ms"], 80.0) and _close(point["itl_p99_ms"], 20.0)
    assert point["tokens_per_s"] == 12.0
    client = ClientWindow()
    client.add(5.0, tick)
    doc = dashboard(
        now=5.0,
        model="tinyllm",
        target="http://127.0.0.1:1",
        state="running",
        users=2,
        client=client,
        server=ServerWindow(),
        history=[tick_point(5.0, tick, None)],
        config=None,
        errors={},
        goals=TokenGoals(ttft_p99_ms=60.0),
    )
    assert doc["history"][0]["tokens_per_s"] == 12.0
    rows = {r["metric"]: r["value"] for r in table_rows(doc)}
    for row, (p50, p99) in (("TTFT", (50.0, 80.0)), ("ITL", (10.0, 20.0))):
        text = rows[f"{row} p50 / p99 (client)"]
        shown = [float(v) for v in re.findall(r"[\d.]+", text)]
        assert text.endswith(" ms") and _close(shown[0], p50) and _close(shown[1], p99), text
    assert rows["output tokens/s (client)"] == "12.0"
    assert rows["goodput (client)"] == "1.00 req/s"  # one of two streams within TTFT 60 ms
    assert rows["failed streams (client)"] == "0"


def test_target_settings_carry_the_generative_users_form() -> None:
    plain = TargetSettings.from_locust("h:1", None)
    assert (plain.stream, plain.ttft_p99_ms, plain.itl_p99_ms) == ("generate-stream", None, None)
    assert plain.lengths.describe() == "input 128 tokens, output 64 tokens"
    opts = argparse.Namespace(
        stream_protocol="openai",
        input_tokens="uniform:100,200",
        output_tokens="32",
        ttft_p99_ms=500.0,
        itl_p99_ms=0.0,  # 0 in the form: no goal
    )
    s = TargetSettings.from_locust("h:1", opts)
    assert (s.stream, s.ttft_p99_ms, s.itl_p99_ms) == ("openai", 500.0, None)
    assert s.lengths.describe() == "input uniform:100,200 tokens, output 32 tokens"
    bad = TargetSettings.from_locust("h:1", argparse.Namespace(output_tokens="lots"))
    with pytest.raises(InputError, match="--output-tokens"):
        bad.lengths  # noqa: B018


def test_generative_options_reach_the_form_and_bad_ones_stop_before_anything_starts() -> None:
    options = UiOptions(
        stream="openai", input_tokens="256", output_tokens="lognormal:mean=64,sd=16",
        ttft_p99_ms=400.0,
    )  # fmt: skip
    options.check()
    master, _ = locust_commands(options, "http://h:1", None, None)
    given = {master[i]: master[i + 1] for i in range(len(master) - 1)}
    assert given["--stream-protocol"] == "openai"
    assert given["--input-tokens"] == "256"
    assert given["--output-tokens"] == "lognormal:mean=64,sd=16"
    assert given["--ttft-p99-ms"] == "400"
    assert "--itl-p99-ms" not in master
    plain, _ = locust_commands(UiOptions(), "http://h:1", None, None)
    assert "--stream-protocol" not in plain  # the form's own default
    for bad, message in (
        ({"stream": "grpc"}, "generative users speak one of"),
        ({"input_tokens": "0"}, "--input-tokens"),
        ({"itl_p99_ms": -1.0}, "--itl-p99-ms must be positive"),
    ):
        with pytest.raises(InputError, match=message):
            UiOptions(**bad).check()  # type: ignore[arg-type]


ENGINE = {
    "engine": True,
    "engine_name": "vllm",
    "settings_known": True,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 2048,
    "enable_chunked_prefill": True,
    "gpu_memory_utilization": 0.9,
    "instance_count": 1,
}


def test_engine_request_merges_and_parses() -> None:
    out = parse_engine_request(
        {"max_num_seqs": "16", "enable_chunked_prefill": "off", "gpu_memory_utilization": ""},
        ENGINE,
    )
    assert out == {**ENGINE, "max_num_seqs": 16, "enable_chunked_prefill": False}
    assert parse_engine_request({"gpu_memory_utilization": "0.5"}, ENGINE)[
        "gpu_memory_utilization"
    ] == pytest.approx(0.5)
    assert parse_engine_request({"enable_chunked_prefill": True}, ENGINE)["enable_chunked_prefill"]


@pytest.mark.parametrize(
    ("posted", "message"),
    [
        ({"max_batch_size": 8}, "unknown engine field"),
        ({"max_num_seqs": 0}, "between 1 and"),
        ({"max_num_batched_tokens": "lots"}, "must be an integer"),
        ({"enable_chunked_prefill": "maybe"}, "true or false"),
        ({"gpu_memory_utilization": 1.5}, r"share in \(0, 1\]"),
        ("16", "JSON object"),
    ],
)
def test_engine_request_refuses_bad_input(posted: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_engine_request(posted, ENGINE)


def test_engine_settings_are_a_table_row() -> None:
    doc = {**_doc(), "config": ENGINE}
    rows = {r["metric"]: r["value"] for r in table_rows(doc)}
    assert rows["engine settings (vllm)"] == (
        "max_num_seqs 8, max_num_batched_tokens 2048, chunked prefill on, "
        "gpu_memory_utilization 0.9, instances 1"
    )
    unknown = {**ENGINE, "settings_known": False, "gpu_memory_utilization": None}
    rows = {r["metric"]: r["value"] for r in table_rows({**doc, "config": unknown})}
    assert rows["engine settings (vllm)"].endswith(
        "gpu_memory_utilization -, instances 1 (defaults: not read from the server)"
    )
    assert "model config" not in rows
    # Triton's batch statistics say nothing of an engine's per-step batching: left out.
    assert "average batch size" not in rows and "queue time / request" not in rows
    assert "failures by reason (server)" in rows


def test_a_generative_model_runs_the_stream_locustfile_with_its_engine_file() -> None:
    engine_file = {"model": "tinyllm", "max_num_seqs": 8}
    master, workers = locust_commands(
        UiOptions(), "http://h:1", None, None, engine_file, generative=True
    )
    for line in (master, *workers):
        assert line[line.index("-f") + 1].endswith("stream_locustfile.py")
    given = json.loads(master[master.index("--perfsweep-engine-file") + 1])
    assert given == engine_file
    plain, _ = locust_commands(UiOptions(), "http://h:1", None, None)
    assert plain[plain.index("-f") + 1].endswith("/locustfile.py")
    assert "--perfsweep-engine-file" not in plain
