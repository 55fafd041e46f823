"""The measurement engine on Locust: the ONLY package that imports locust or gevent.

Importing ``LocustLoadGenerator`` or ``EngineOptions`` from here monkey-patches the process
(``import locust`` runs gevent's ``patch_all``) and initialises gRPC for gevent, in that order
(``analyzer/load/_gevent.py``). Importing the package itself, or its pure modules ``inputs``,
``recorder`` and ``engine`` (``EngineOptions`` and the ``engine_options(scenario, url, model)``
factory the sweep and the gate build them with), patches nothing. Modules outside
``analyzer/load`` import the engine lazily, inside the function that needs it, so ``perfsweep
serve`` and ``--help`` stay unpatched.

Public API::

    from analyzer.load import EngineOptions, LocustLoadGenerator

Layer 6 of ``analyzer`` (``docs/internals.md``): imports ``target`` and the layers below it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analyzer.load.engine import EngineOptions
    from analyzer.load.runner import LocustLoadGenerator

__all__ = ["EngineOptions", "LocustLoadGenerator"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from analyzer.load import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'analyzer.load' has no attribute {name!r}")
