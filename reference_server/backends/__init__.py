"""Model backends: how a batch of requests is executed.

The API mirrors Triton's Python backend (``initialize``, ``execute(requests) -> responses``,
``finalize``); :func:`create_backend` (:mod:`~reference_server.backends.registry`) picks the
implementation from the config's ``backend`` / ``platform``. Heavy imports (onnxruntime) happen
only when that backend is chosen.
"""

from reference_server.backends.base import Backend, BackendArgs, mark_compute
from reference_server.backends.registry import create_backend

__all__ = ["Backend", "BackendArgs", "create_backend", "mark_compute"]
