"""A Triton-compatible dynamic-batching inference server, usable on its own.

``python -m reference_server --model-repository DIR`` or ``perfsweep serve``. It speaks
KServe v2 over HTTP/REST and gRPC, the model-repository and statistics extensions and
Prometheus metrics with Triton's names, so ``tritonclient`` works against it unchanged.

Access control follows ``tritonserver``'s flags and answers: ``--grpc-use-ssl`` /
``--grpc-use-ssl-mutual`` with ``--grpc-server-cert``, ``--grpc-server-key`` and
``--grpc-root-cert`` put the gRPC port behind TLS (``frontends/tls.py``), and
``--http-restricted-api`` / ``--grpc-restricted-protocol`` ``<group>,...:<key>=<value>``
refuse an API group to requests without that header (``frontends/restricted.py``). HTTP,
metrics and the bind address (127.0.0.1) are unchanged by them.

Layers, each a folder: ``frontends/`` (HTTP, gRPC, wire encodings) call ``core/`` (server
facade, model runtime, repository, config, stats, cache), which hands requests to
``batching/`` (batch formation, scheduler, instances); ``backends/`` execute, ``zoo/`` builds
bundled models. ``app`` assembles them into one process; ``ready`` is the line it prints;
``compat`` names the Triton release whose behaviour it follows.

The three names most users need are exported here and imported on first use, so that
``import reference_server.core.errors`` stays light::

    from reference_server import InferenceServer, ServerOptions, ServerThread
"""

from typing import TYPE_CHECKING, Any

from reference_server.compat import TRITON_COMPAT_VERSION

__version__ = "0.1.0"

__all__ = ["TRITON_COMPAT_VERSION", "InferenceServer", "ServerOptions", "ServerThread"]

if TYPE_CHECKING:
    from reference_server.app import ServerOptions, ServerThread
    from reference_server.core.server import InferenceServer


def __getattr__(name: str) -> Any:
    if name == "InferenceServer":
        from reference_server.core.server import InferenceServer

        return InferenceServer
    if name in ("ServerOptions", "ServerThread"):
        from reference_server import app

        return getattr(app, name)
    raise AttributeError(f"module 'reference_server' has no attribute {name!r}")
