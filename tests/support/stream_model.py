"""A decoupled Python-backend model for a real Triton: the interface of Triton's vLLM backend.

Inputs ``text_input`` (TYPE_STRING [1]), ``stream`` (TYPE_BOOL [1], optional),
``sampling_parameters`` (TYPE_STRING [1], optional: JSON with ``max_tokens``),
``exclude_input_in_output`` (TYPE_BOOL [1], optional); output ``text_output`` (TYPE_STRING).
Each request is answered from a thread of its own (requests overlap, as an engine's sequences
do): it sleeps ``first_token_ms`` (the prefill), sends one response per token (`` tok<i>``)
with ``token_ms`` between them, then a final, empty response flagged
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.

The output length is ``max_tokens`` of ``sampling_parameters`` or, as Triton's generate
extension passes its ``parameters``, of the request parameters (default 16); the prompt's words
are counted (``prompt_tokens`` in the log line ``ignored``). The wheel's stub is built against
numpy 1: under numpy 2 it aborts on any BYTES input (it reads garbage lengths), so the server
that runs this model puts a numpy 1 first on the stub's path (:func:`stub_numpy1`).

With the config parameter ``max_num_seqs`` = n, at most n requests generate at once (the rest
wait, so time to first token grows with the load, as on an engine at its limit); a
``<version>/model.json`` (Triton's vLLM backend's engine file) with ``max_num_seqs`` overrides
it, and the model logs the value it runs (``engine max_num_seqs=<n>``). Installed as a Python-based
backend named ``vllm`` (:func:`install_vllm_backend`), a model whose config says ``backend:
"vllm"`` runs it as a vLLM model is run: its engine settings in ``model.json``, which a
repository load can override (``file:1/model.json``). With the
config parameter ``fail_after`` = k, each request gets ``k`` tokens and then an error
response (the stream ends early): the client must count a failed request and keep its tokens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

#: The numpy the wheel's stub was built against.
STUB_NUMPY = "numpy==1.26.4"


def stub_numpy1(dest: Path) -> Path:
    """A directory holding numpy 1 (``pip install --target``), for ``RealTriton(stub_paths=...)``;
    reused when it is already there.

    Raises:
        RuntimeError: pip could not install it (no registry reachable): the caller skips.
    """
    if (dest / "numpy" / "__init__.py").exists():
        return dest
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(dest),
            STUB_NUMPY,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip install {STUB_NUMPY} failed: {result.stderr[-500:]}")
    return dest


STREAM_MODEL_SOURCE = '''\
"""Decoupled token-streaming model (written by tests/support/stream_model.py)."""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return float(value) if value else default




def _text(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return ""
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def _client_left(sender):
    """Whether the request's client went away (then its stream is closed: vLLM aborts it)."""
    if not sender.is_cancelled():
        return False
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    return True


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.first_s = _param(config, "first_token_ms", 20.0) / 1000.0
        self.token_s = _param(config, "token_ms", 10.0) / 1000.0
        fail_after = _param(config, "fail_after", -1.0)
        self.fail_after = int(fail_after) if fail_after >= 0 else None
        seqs = int(_param(config, "max_num_seqs", 0.0))
        engine = os.path.join(args["model_repository"], args["model_version"], "model.json")
        if os.path.exists(engine):
            with open(engine) as f:
                seqs = int(json.load(f).get("max_num_seqs", seqs))
        pb_utils.Logger.log_info(f"engine max_num_seqs={seqs}")
        self.slots = threading.Semaphore(seqs) if seqs else None
        self.threads = []

    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            params.update(json.loads(_text(request, "sampling_parameters") or "{}"))
            max_tokens = int(params.get("max_tokens", 16))
            thread = threading.Thread(
                target=self.stream,
                args=(request.get_response_sender(), max_tokens, self.fail_after),
                daemon=True,
            )
            thread.start()
            self.threads.append(thread)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def stream(self, sender, max_tokens, fail_after):
        if self.slots is None:
            self.generate(sender, max_tokens, fail_after)
            return
        # A request waits for a free sequence slot (TTFT grows with load); one whose client went
        # away is dropped, as vLLM aborts it.
        while not self.slots.acquire(timeout=0.01):
            if _client_left(sender):
                return
        try:
            self.generate(sender, max_tokens, fail_after)
        finally:
            self.slots.release()

    def generate(self, sender, max_tokens, fail_after):
        time.sleep(self.first_s)
        for i in range(max_tokens):
            if fail_after is not None and i >= fail_after:
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("engine stopped the sequence")
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                return
            if i:
                time.sleep(self.token_s)
            if _client_left(sender):
                return
            out = pb_utils.Tensor("text_output", np.array([f" tok{i}".encode()], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
'''


def install_vllm_backend(backends: Path) -> None:
    """:data:`STREAM_MODEL_SOURCE` as the Python-based backend ``vllm`` of a Triton whose
    ``--backend-directory`` is ``backends`` (``backends/vllm/model.py``; the stub and
    ``libtriton_python.so`` are found in ``backends/python``), as Triton's vLLM backend is
    installed."""
    (backends / "vllm").mkdir(parents=True, exist_ok=True)
    (backends / "vllm" / "model.py").write_text(STREAM_MODEL_SOURCE)


def stream_model_config(
    name: str,
    *,
    first_token_ms: float = 20.0,
    token_ms: float = 10.0,
    decoupled: bool = True,
    fail_after: int | None = None,
    max_num_seqs: int = 0,
) -> mc.ModelConfig:
    """The config of :data:`STREAM_MODEL_SOURCE` (``decoupled=False``: the same interface on a
    model that is not decoupled, which a TTFT measurement must refuse)."""
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    config.model_transaction_policy.decoupled = decoupled
    for in_name, dtype, optional in (
        ("text_input", mc.TYPE_STRING, False),
        ("stream", mc.TYPE_BOOL, True),
        ("sampling_parameters", mc.TYPE_STRING, True),
        ("exclude_input_in_output", mc.TYPE_BOOL, True),
    ):
        config.input.add(name=in_name, data_type=dtype, dims=[1], optional=optional)
    config.output.add(name="text_output", data_type=mc.TYPE_STRING, dims=[-1])
    config.parameters["first_token_ms"].string_value = f"{first_token_ms:g}"
    config.parameters["token_ms"].string_value = f"{token_ms:g}"
    if fail_after is not None:
        config.parameters["fail_after"].string_value = str(fail_after)
    if max_num_seqs:
        config.parameters["max_num_seqs"].string_value = str(max_num_seqs)
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    return config
