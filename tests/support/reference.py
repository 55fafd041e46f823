"""Moved to :mod:`tests.support.servers`; these names stay importable for ``benchmarks/``.

Tests import from ``tests.support.servers``. This module goes once the benchmarks do too.
"""

from tests.support.servers import (
    REFERENCE_BACKEND,
    ReferenceProcess,
    ReferenceServer,
    ServerKind,
    for_reference,
    start_server,
)

__all__ = [
    "REFERENCE_BACKEND",
    "ReferenceProcess",
    "ReferenceServer",
    "ServerKind",
    "for_reference",
    "start_server",
]
