"""Which backend serves a model: a table of names, each imported only when a model needs it.

A config's ``backend`` (or ``platform``) names its backend; :data:`BACKENDS` maps that name to
``"module:Class"``, and :func:`create_backend` imports the module by that name when an
instance is created. So nothing imports a backend it does not run (onnxruntime is imported
only for an ONNX model), and :mod:`reference_server.backends.base`, the protocol every backend
implements, imports no backend: the backends build on it, and this table sits above them all.
"""

from __future__ import annotations

import importlib

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.base import Backend
from reference_server.core.errors import BackendError, Code

#: Backend (or platform) name -> ``"module:Class"`` of its implementation.
BACKENDS: dict[str, str] = {
    "identity": "reference_server.backends.identity:IdentityBackend",
    "add_sub": "reference_server.backends.add_sub:AddSubBackend",
    "simulated": "reference_server.backends.simulated:SimulatedBackend",
    "accumulator": "reference_server.zoo.accumulator:AccumulatorBackend",
    "onnxruntime": "reference_server.backends.onnxruntime:OnnxRuntimeBackend",
    "onnxruntime_onnx": "reference_server.backends.onnxruntime:OnnxRuntimeBackend",
    # Triton's vLLM backend, played by the reference engine (iteration-level batching).
    "vllm": "reference_server.backends.generative:GenerativeBackend",
}


def create_backend(config: mc.ModelConfig) -> Backend:
    """Choose the backend implementation for a normalized config.

    Raises:
        BackendError: no backend of that name exists here.
    """
    name = config.backend or config.platform
    if name not in BACKENDS:
        raise BackendError(
            f"unable to find backend library for backend '{name}', try specifying runtime on "
            "the model configuration.",
            Code.INVALID_ARG,
        )
    module, _, cls = BACKENDS[name].partition(":")
    backend: Backend = getattr(importlib.import_module(module), cls)()
    return backend
