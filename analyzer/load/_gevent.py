"""Patch this process for gevent, then make gRPC gevent-aware, in that order, exactly once;
and :func:`freeze_heap`, what every generator process does before it sends.

Every module of ``analyzer.load`` that touches sockets imports this first. ``import locust`` runs
gevent's ``patch_all``; ``init_gevent`` must follow the patch and precede any gRPC object
(``research/locust.md`` §1.7, §5). The pure modules (``inputs``, ``recorder``) do not import it,
so tests of them stay unpatched.
"""

from __future__ import annotations

import gc

import locust  # noqa: F401  (patches the standard library)
from grpc.experimental import gevent as _grpc_gevent

_grpc_gevent.init_gevent()


def freeze_heap() -> None:
    """Collect once, then move every object alive now out of the collector's reach.

    A full collection walks every tracked object, and in a generator process most of them
    come from its imports (locust, tritonclient; optuna, pandas, matplotlib beside a sweep):
    ~100 ms with the hub stopped, mid-level, so dozens of requests were sent that late and
    the level read invalid. What exists when a generator starts lives as long as it does:
    frozen (``gc.freeze``), later passes walk only what the levels allocate.
    """
    gc.collect()
    gc.freeze()
