"""The measurement engine on Locust: the ONLY package that imports locust or gevent.

Importing anything from here monkey-patches the process (``import locust`` runs gevent's
``patch_all``) and initialises gRPC for gevent, in that order, before any channel exists (see
``research/locust.md`` §1.7 and §5). Modules outside ``analyzer/load`` import it lazily, inside
the function that needs it, so ``perfsweep serve`` and ``--help`` stay unpatched.

Public API::

    from analyzer.load import EngineOptions, LocustLoadGenerator
"""

from __future__ import annotations

import locust  # noqa: F401  (first: patches the standard library for gevent)
from grpc.experimental import gevent as _grpc_gevent

_grpc_gevent.init_gevent()

from analyzer.load.runner import EngineOptions, LocustLoadGenerator  # noqa: E402

__all__ = ["EngineOptions", "LocustLoadGenerator"]
