"""Patch this process for gevent, then make gRPC gevent-aware, in that order, exactly once.

Every module of ``analyzer.load`` that touches sockets imports this first. ``import locust`` runs
gevent's ``patch_all``; ``init_gevent`` must follow the patch and precede any gRPC object
(``research/locust.md`` §1.7, §5). The pure modules (``inputs``, ``recorder``) do not import it,
so tests of them stay unpatched.
"""

from __future__ import annotations

import locust  # noqa: F401  (patches the standard library)
from grpc.experimental import gevent as _grpc_gevent

_grpc_gevent.init_gevent()
