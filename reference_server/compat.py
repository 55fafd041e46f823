"""The Triton release whose behaviour this server follows (reported by ``GET /v2``).

A module of its own, below every layer: the core reports it, and the package's ``__init__``
exports it without importing the core.
"""

#: The Triton release whose behaviour this server follows (reported by ``GET /v2``).
TRITON_COMPAT_VERSION = "2.51.0"
