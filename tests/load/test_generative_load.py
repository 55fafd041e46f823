"""``perfsweep load`` on generative models: token streams measured over the protocols real
servers speak.

A real Triton 2.51 with a decoupled Python-backend model (``tests/support/stream_model.py``: a
planted prefill of 40 ms, then a token every 10 ms) over gRPC ``ModelStreamInfer`` and the
``generate_stream`` SSE; the OpenAI-compatible SSE against a minimal streaming server
(``tests/support/openai_stream.py``, a test double for the framing only). Assertions are on
counts (every token of every request) and on TTFT/ITL against the planted sleeps with generous
margins, never on wall-clock totals.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.load.refserver import REPO_ROOT
from tests.support.real_triton import RealTriton, TritonInstall
from tests.support.stream_model import STREAM_MODEL_SOURCE, stream_model_config, stub_numpy1

FIRST_MS = 40.0
TOKEN_MS = 10.0
SHORT = ("--window-s", "1", "--max-windows", "3", "--warmup-s", "0.5")


def _perfsweep(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "perfsweep"), "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )


def _level(out: Path) -> dict[str, Any]:
    (m,) = json.loads(out.read_text())["results"]
    return m


@pytest.fixture(scope="module")
def stream_triton(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealTriton]:
    """A real Triton serving the streaming model: ``llm`` (decoupled), ``llm_cut`` (ends every
    stream with an error after 3 tokens), ``llm_once`` (the same interface, not decoupled)."""
    try:
        numpy1 = stub_numpy1(tmp_path_factory.mktemp("stub_numpy1"))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no numpy 1 for the Python-backend stub's BYTES tensors: {exc}")
    triton = RealTriton(triton_install, tmp_path_factory.mktemp("stream_triton"), cwd=numpy1)
    triton.start()
    try:
        for config in (
            stream_model_config("llm", first_token_ms=FIRST_MS, token_ms=TOKEN_MS),
            stream_model_config("llm_cut", fail_after=3),
            stream_model_config("llm_once", decoupled=False),
        ):
            triton.add_model(config, STREAM_MODEL_SOURCE)
            triton.load_model(config.name)
        yield triton
    finally:
        triton.stop()


def _assert_planted(m: dict[str, Any], output_tokens: int) -> None:
    """Every request streamed all its tokens; TTFT and ITL sit near the planted sleeps."""
    t = m["tokens"]
    assert m["error_count"] == 0 and t["failed_streams"] == 0
    assert t["streams"] == m["request_count"] > 0
    assert t["output_tokens"] == output_tokens * t["streams"]
    # TTFT >= the planted prefill; ITL near the planted step (generous upper margins: a shared
    # machine delays, never hastens).
    assert FIRST_MS * 0.95 <= t["ttft_p50_ms"] <= FIRST_MS * 4
    assert TOKEN_MS * 0.9 <= t["itl_p50_ms"] <= TOKEN_MS * 4
    assert TOKEN_MS * 0.9 <= t["mean_itl_p50_ms"] <= TOKEN_MS * 4
    # Tokens/s and req/s agree: each request brought its tokens.
    assert t["output_tokens_per_s"] == pytest.approx(
        output_tokens * t["streams"] / m["duration_s"], rel=0.01
    )


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc-stream", "generate-stream", None])
def test_triton_streams_are_timed_token_by_token(
    stream_triton: RealTriton, tmp_path: Path, protocol: str | None
) -> None:
    # None: no --protocol; the token flags make the default HTTP a generate_stream.
    out = tmp_path / "m.json"
    done = _perfsweep(
        "--url",
        stream_triton.http_url,
        "--grpc-url",
        stream_triton.grpc_url,
        *(("--protocol", protocol) if protocol else ()),
        "--model",
        "llm",
        "--rate-rps",
        "4",
        "--input-tokens",
        "uniform:8,32",
        "--output-tokens",
        "6",
        "--ttft-p99-ms",
        "5000",
        *SHORT,
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m = _level(out)
    _assert_planted(m, 6)
    # Every request met the loose TTFT goal: goodput is the request rate.
    assert m["tokens"]["good_count"] == m["tokens"]["streams"]
    assert "token streams" in done.stdout and "goodput" in done.stdout
    # Triton's own statistics count the same requests.
    assert m["server"]["success_count"] >= m["request_count"] - 2


@pytest.mark.triton
def test_stream_ended_by_an_error_is_a_failed_request_with_its_tokens(
    stream_triton: RealTriton, tmp_path: Path
) -> None:
    out = tmp_path / "cut.json"
    done = _perfsweep(
        "--url",
        stream_triton.http_url,
        "--grpc-url",
        stream_triton.grpc_url,
        "--protocol",
        "grpc-stream",
        "--model",
        "llm_cut",
        "--rate-rps",
        "4",
        "--output-tokens",
        "8",
        *SHORT,
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m = _level(out)
    t = m["tokens"]
    assert m["request_count"] > 0 and m["error_count"] == m["request_count"]
    assert t["failed_streams"] == t["streams"] == m["request_count"]
    assert t["output_tokens"] == 3 * t["streams"]  # the tokens sent before the error are kept
    assert any("engine stopped the sequence" in kind for kind in m["errors"])


@pytest.mark.triton
def test_a_model_that_answers_once_is_refused_for_ttft(
    stream_triton: RealTriton, tmp_path: Path
) -> None:
    done = _perfsweep(
        "--url",
        stream_triton.http_url,
        "--protocol",
        "generate-stream",
        "--model",
        "llm_once",
        "--rate-rps",
        "2",
        *SHORT,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "'llm_once' is not decoupled" in done.stderr


# ---- OpenAI-compatible SSE --------------------------------------------------------------------


@contextlib.contextmanager
def _openai_double(*extra: str) -> Iterator[str]:
    """The streaming test double on a free port with the planted times; its address."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.openai_stream",
            "--first-token-ms",
            str(FIRST_MS),
            "--token-ms",
            str(TOKEN_MS),
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        yield f"127.0.0.1:{line.split()[1]}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def openai_server(serves: None) -> Iterator[str]:
    with _openai_double() as address:
        yield address


@pytest.fixture
def openai_cut_server(serves: None) -> Iterator[str]:
    """The test double cutting every stream after 2 tokens (no ``[DONE]``)."""
    with _openai_double("--close-after", "2") as address:
        yield address


@pytest.mark.parametrize("protocol", ["openai", "openai-chat"])
def test_openai_streams_are_timed_token_by_token(
    openai_server: str, tmp_path: Path, protocol: str
) -> None:
    out = tmp_path / "o.json"
    data = tmp_path / "requests.jsonl"
    data.write_text(
        '{"prompt": "a b c d", "output_tokens": 5}\n{"input_tokens": 20, "output_tokens": 5}\n'
    )
    done = _perfsweep(
        "--url",
        openai_server,
        "--protocol",
        protocol,
        "--model",
        "llm",
        "--concurrency",
        "2",
        "--dataset",
        str(data),
        *SHORT,
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m = _level(out)
    _assert_planted(m, 5)
    assert m["tokens"]["input_tokens"] > 0


@pytest.fixture
def openai_keepalive_server(serves: None) -> Iterator[str]:
    """The test double closing keep-alive connections idle for 100 ms."""
    with _openai_double("--keepalive-ms", "100") as address:
        yield address


def test_a_kept_connection_the_server_closed_is_not_a_failed_request(
    openai_keepalive_server: str, tmp_path: Path
) -> None:
    # 4 req/s of 2-token streams (about 50 ms each): every kept connection waits about 200 ms
    # for its next request, twice what the server keeps it open; the request goes on a new one.
    out = tmp_path / "keepalive.json"
    done = _perfsweep(
        "--url",
        openai_keepalive_server,
        "--protocol",
        "openai",
        "--model",
        "llm",
        "--rate-rps",
        "4",
        "--arrival",
        "constant",
        "--output-tokens",
        "2",
        *SHORT,
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m = _level(out)
    assert m["request_count"] > 4
    assert m["error_count"] == m["tokens"]["failed_streams"] == 0, done.stdout[-2000:]
    assert m["tokens"]["output_tokens"] == 2 * m["tokens"]["streams"]


def test_openai_stream_cut_before_done_is_a_failed_request(
    openai_cut_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "cut.json"
    done = _perfsweep(
        "--url",
        openai_cut_server,
        "--protocol",
        "openai",
        "--model",
        "llm",
        "--rate-rps",
        "4",
        "--output-tokens",
        "6",
        *SHORT,
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m = _level(out)
    t = m["tokens"]
    assert m["request_count"] > 0 and t["failed_streams"] == m["error_count"] == m["request_count"]
    assert t["output_tokens"] == 2 * t["streams"]
