"""tests/support/llm_model.py without starting vLLM: where the environment is looked for and
what is said when it is missing, the server's command line, the model cache's key."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from tests.support import llm_model
from tests.support.llm_model import MODEL_NAME, VllmInstall, VllmServer, VllmUnavailable


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="vLLM's CPU build: Linux"
)
def test_a_missing_environment_names_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFSWEEP_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(VllmUnavailable, match="make setup-llm"):
        VllmInstall.locate()
    # An environment whose install did not finish (no .installed mark) is missing too.
    (tmp_path / "half" / "bin").mkdir(parents=True)
    (tmp_path / "half" / "bin" / "python").touch()
    monkeypatch.setenv("PERFSWEEP_VLLM_VENV", str(tmp_path / "half"))
    with pytest.raises(VllmUnavailable, match="make setup-llm"):
        VllmInstall.locate()


def test_the_server_command_line(tmp_path: Path) -> None:
    server = VllmServer(
        VllmInstall(tmp_path / "python"),
        tmp_path / "model",
        tmp_path,
        max_num_seqs=2,
        max_num_batched_tokens=256,
        extra_args=("--enforce-eager",),
        port=8123,
    )
    command = server.command()
    assert command[:3] == [str(tmp_path / "python"), "-m", "vllm.entrypoints.openai.api_server"]

    def after(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert after("--host") == "127.0.0.1"  # loopback only
    assert (after("--port"), after("--served-model-name")) == ("8123", MODEL_NAME)
    assert (after("--max-num-seqs"), after("--max-num-batched-tokens")) == ("2", "256")
    assert after("--model") == str(tmp_path / "model")
    assert command[-1] == "--enforce-eager"
    # vLLM's default token budget unless one is given.
    default = VllmServer(VllmInstall(tmp_path), tmp_path, tmp_path).command()
    assert "--max-num-batched-tokens" not in default


def test_the_model_cache_is_keyed_by_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = llm_model.model_dir(tmp_path)
    assert first.parent == tmp_path / "llm"
    assert llm_model.model_dir(tmp_path) == first
    monkeypatch.setattr(llm_model, "SPEC", {**llm_model.SPEC, "seed": 1})
    assert llm_model.model_dir(tmp_path) != first
    # The CPU attention kernels refuse head sizes below 32.
    spec = llm_model.SPEC
    assert spec["hidden_size"] // spec["num_attention_heads"] >= 32
