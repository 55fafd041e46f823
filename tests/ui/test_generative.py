"""``perfsweep ui`` on a generative model: the reference engine's ``tinyllm`` as its own process,
the dashboard's stream users over OpenAI's streaming protocol, real Locust, real requests.

The dashboard's token figures are held to what the server itself counted once the load has
stopped: the streams it finished (``vllm:request_success_total``) and the tokens it generated
(``vllm:generation_tokens_total``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reference_server.ready import last_ready
from reference_server.zoo import tinyllm
from tests.ui.support import (
    UI_READY,
    Child,
    NotYet,
    http,
    perfsweep,
    reference_server,
    start_ui,
    wait_until,
)

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.timeout(240)]

MODEL = tinyllm.MODEL_NAME
OUTPUT_TOKENS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("ui-llm")
    tinyllm.make_repository(root / "repo")
    with reference_server(root / "repo", root / "server.log") as fields:
        yield fields


def _doc(base: str) -> dict[str, Any]:
    status, doc = http("GET", f"{base}/perfsweep/server")
    assert status == 200, doc
    assert isinstance(doc, dict)
    return doc


def _generated(metrics_url: str) -> float:
    """The server's own count of generated tokens (``vllm:generation_tokens_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http("GET", metrics_url)
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.removesuffix("_total") == "vllm:generation_tokens"
        and s.labels.get("model_name") == MODEL
    )


def _finished(metrics_url: str) -> float:
    """Streams the server finished (``vllm:request_success_total``; a cut stream is not)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http("GET", metrics_url)
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:request_success_total" and s.labels.get("model_name") == MODEL
    )


def test_stream_users_show_ttft_itl_tokens_and_goodput_live(
    tmp_path: Path, server: dict[str, str]
) -> None:
    http_url, metrics_url = f"http://{server['http']}", f"http://{server['metrics']}/metrics"
    before, finished_before = _generated(metrics_url), _finished(metrics_url)
    child, base = start_ui(
        tmp_path,
        http_url,
        MODEL,
        server["grpc"],
        metrics_url,
        "--protocol",
        "openai",
        "--input-tokens",
        "16",
        "--output-tokens",
        str(OUTPUT_TOKENS),
        "--ttft-p99-ms",
        "60000",
    )
    try:
        status, page = http("GET", base + "/")
        assert status == 200 and "TritonStreamUser" in page and "stream_protocol" in page
        form = {
            "user_count": 3,
            "spawn_rate": 3,
            "user_classes": ["TritonStreamUser", "TritonStreamOpenLoopUser"],
            "rate_per_user": 2,
        }
        status, answer = http("POST", f"{base}/swarm", form=form)
        assert status == 200 and answer["success"], answer
        doc = wait_until(
            lambda: (
                (d := _doc(base))["client"]["window"]["tokens"]
                and d["client"]["window"]["tokens"]["streams"] >= 12
                and d
            ),
            90,
            "12 token streams seen by the dashboard",
        )
        tokens = doc["client"]["window"]["tokens"]
        assert tokens["failed_streams"] == 0, doc["client"]["window"]["error_kinds"]
        # Every stream asked for exactly OUTPUT_TOKENS (ignore_eos): the server's usage says so.
        assert tokens["output_tokens"] == OUTPUT_TOKENS * tokens["streams"]
        assert 0 < tokens["ttft_p50_ms"] <= tokens["ttft_p99_ms"]
        assert 0 < tokens["itl_p50_ms"] <= tokens["itl_p99_ms"]
        assert tokens["output_tokens_per_s"] > 0
        # A TTFT goal of a minute: every stream is good.
        assert tokens["goals"] == {"ttft_p99_ms": 60000.0, "itl_p99_ms": None}
        assert tokens["goodput_rps"] == pytest.approx(
            doc["client"]["window"]["throughput_rps"], rel=0.02
        )
        points = [p for p in doc["history"] if p["ttft_p99_ms"] is not None]
        assert points and all(p["itl_p99_ms"] > 0 and p["tokens_per_s"] > 0 for p in points)
        stats = http("GET", base + "/stats/requests")[1]
        rows = {r["metric"]: r["value"] for r in stats["extended_stats"][0]["data"]}
        assert rows["output tokens/s (client)"] and rows["failed streams (client)"] == "0"
        # Locust's own statistics see each stream and its time to first token.
        assert {"stream", "ttft"} <= {e["method"] for e in stats["stats"] if e["name"] == MODEL}
        # A --url server's engine file is out of reach: the form refuses to replace it blind.
        assert _doc(base)["config"]["settings_known"] is False
        status, refused = http("POST", base + "/perfsweep/config", body={"max_num_seqs": 4})
        assert status == 400 and "cannot be read from the server" in refused["error"]

        assert http("POST", base + "/stop")[0] == 200

        def settled() -> tuple[float, float, dict[str, Any]]:
            # The server's counts stop moving once the streams cut by the stop are gone.
            first = (_generated(metrics_url), _finished(metrics_url))
            seen = _doc(base)["client"]["since_start"]["tokens"]
            if (_generated(metrics_url), _finished(metrics_url)) != first:
                raise NotYet("tokens still being generated")
            return first[0] - before, first[1] - finished_before, seen

        generated, finished, seen = wait_until(settled, 30, "the server to go quiet", poll_s=1.0)
        # Every stream the dashboard counted, the server finished, with its tokens; the streams
        # the stop cut short (in flight then) the server generated for, or finished unseen.
        assert seen["output_tokens"] == OUTPUT_TOKENS * seen["streams"] <= generated
        assert finished / 2 <= seen["streams"] <= finished
    finally:
        assert child.stop() in (0, 130), child.tail()


def _metric(metrics_url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http("GET", metrics_url)
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("model_name") == MODEL
    )


def test_a_generative_model_gets_stream_users_and_its_engine_form(tmp_path: Path) -> None:
    """``perfsweep ui --model tinyllm --device sim``: no --protocol, the model tells. The form
    offers stream users only, and the config form sets the engine (applied while load runs)."""
    child = Child(
        perfsweep(
            "ui", "--model", MODEL, "--device", "sim", "--web-port", "0",
            "--output-dir", str(tmp_path / "ui"), "--output-tokens", "64",
        ),
        tmp_path / "ui.log",
    )  # fmt: skip
    try:
        assert child.wait_line("perfsweep ui: target ", 120).endswith("(token streams)")
        base = re.search(r"(http://\S+?)/ ", child.wait_line(UI_READY) + " ")
        assert base, child.seen
        ui = base.group(1)
        addresses = last_ready((tmp_path / "ui" / "server.log").read_text())
        assert addresses is not None
        metrics_url = addresses.metrics_url
        _, page = http("GET", ui + "/")
        assert "TritonStreamUser" in page and "TritonHttpUser" not in page
        # The bundled model.json as found: the form starts from the engine's own settings.
        doc = wait_until(lambda: (d := _doc(ui))["config"] and d, 30, "the engine settings")
        assert doc["config"]["engine_name"] == "vllm" and doc["config"]["settings_known"]
        assert (doc["config"]["max_num_seqs"], doc["config"]["max_num_batched_tokens"]) == (
            8,
            2048,
        )
        blocks = _metric(metrics_url, "vllm:num_kv_cache_blocks_total")

        form = {"user_count": 8, "spawn_rate": 8, "user_classes": ["TritonStreamUser"]}
        assert http("POST", f"{ui}/swarm", form=form)[1]["success"]
        wait_until(lambda: _doc(ui)["client"]["window"]["tokens"], 60, "the first finished streams")
        posted = {
            "max_num_seqs": 2,
            "gpu_memory_utilization": 0.8,
            "enable_chunked_prefill": "off",
        }
        status, answer = http("POST", ui + "/perfsweep/config", body=posted)
        assert status == 200, answer
        config = answer["config"]
        assert (config["max_num_seqs"], config["gpu_memory_utilization"]) == (2, 0.8)
        assert config["enable_chunked_prefill"] is False
        assert config["max_num_batched_tokens"] == 2048  # not posted: kept
        # The engine runs it: a smaller KV cache, and at most 2 sequences running while the
        # other users' streams wait.
        assert 0 < _metric(metrics_url, "vllm:num_kv_cache_blocks_total") < blocks

        def queued() -> float:
            running = _metric(metrics_url, "vllm:num_requests_running")
            assert running <= 2
            waiting = _metric(metrics_url, "vllm:num_requests_waiting")
            if waiting < 1:
                raise NotYet(f"{waiting} waiting")
            return running

        wait_until(queued, 30, "streams waiting for the 2 running", poll_s=0.2)
        status, refused = http("POST", ui + "/perfsweep/config", body={"max_batch_size": 8})
        assert status == 400 and "unknown engine field" in refused["error"]
        assert http("POST", ui + "/stop")[0] == 200
    finally:
        assert child.stop() in (0, 130), child.tail()
