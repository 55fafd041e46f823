"""``perfsweep load --protocol openai`` against vLLM's CPU build: a user's command on a real engine.

The session's vLLM server (``tests/conftest.py``: the random-weight test model, eager,
``--max-num-seqs 8``). What only a real engine shows: every stream delivers exactly the tokens
asked for by the engine's own count, token by token (a mean inter-token gap above zero), token-id
prompts reach the engine at their exact length, and no request fails over a run long enough for
the server to close idle keep-alive connections (uvicorn does after 5 s).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.llm_model import MODEL_NAME, VllmServer
from tests.support.servers import REPO_ROOT, http_request

INPUT_TOKENS = 24
OUTPUT_TOKENS = 12


def _counter(server: VllmServer, name: str) -> float:
    _, payload = http_request(server.base_url, "GET", "/metrics")
    pattern = re.compile(rf'^vllm:{name}_total\{{[^}}]*model_name="{MODEL_NAME}"[^}}]*\}} (\S+)$')
    return sum(float(m.group(1)) for m in map(pattern.match, payload.decode().splitlines()) if m)


def test_perfsweep_load_streams_from_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    prompt_before = _counter(vllm_server, "prompt_tokens")
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "perfsweep"),
            "load",
            "--url",
            vllm_server.base_url.removeprefix("http://"),
            "--model",
            MODEL_NAME,
            "--protocol",
            "openai",
            "--rate-rps",
            "1.5",
            "--arrival",
            "constant",
            "--input-tokens",
            str(INPUT_TOKENS),
            "--output-tokens",
            str(OUTPUT_TOKENS),
            "--warmup-s",
            "1",
            "--window-s",
            "2",  # 1 s of warm-up and up to three windows: past uvicorn's 5 s keep-alive
            "--max-windows",
            "3",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    (level,) = json.loads(out.read_text())["results"]
    tokens = level["tokens"]
    assert level["error_count"] == 0 and tokens["failed_streams"] == 0, done.stdout[-2000:]
    assert tokens["streams"] == level["request_count"] > 0
    # The engine's own count (usage in the last chunk): exactly what each request asked for.
    assert tokens["output_tokens"] == OUTPUT_TOKENS * tokens["streams"]
    assert tokens["ttft_p50_ms"] > 0
    assert tokens["mean_itl_p50_ms"] > 0  # streamed token by token, not in one chunk
    # Every prompt reached the engine at its exact length: token ids, no tokenizer between.
    prompted = _counter(vllm_server, "prompt_tokens") - prompt_before
    assert prompted > 0 and prompted % INPUT_TOKENS == 0
