"""A Triton-compatible dynamic-batching inference server, usable on its own.

``python -m reference_server --model-repository DIR`` or ``perfsweep serve``. It speaks
KServe v2 over HTTP/REST and gRPC, the model-repository and statistics extensions and
Prometheus metrics with Triton's names, so ``tritonclient`` works against it unchanged.
"""

__version__ = "0.1.0"
#: The Triton release whose behaviour this server follows (reported by ``GET /v2``).
TRITON_COMPAT_VERSION = "2.51.0"
