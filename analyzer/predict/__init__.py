"""Predict-then-verify: a profile of the server's execution times and a simulator of its batcher.

::

    profile.py    Profile (execution time per batch size, provenance, JSON), built from a
                  statistics document, a run directory's trial measurements, or a bundled
                  simulated-device TOML; refuses batch sizes it did not profile
    simulator.py  SimConfig, simulate() -> Prediction at one rate, capacity() -> the highest
                  rate whose simulated p99 meets a goal (bisection); drives the reference
                  server's own ``reference_server.batching.decide.decide``

Errors (both :class:`analyzer.errors.InputError`, exit 2): :class:`ExtrapolationError` (a
config needs a batch size beyond the profiled ones) and :class:`ProfileError` (no profile can
be built from what was given).
"""

from __future__ import annotations

from analyzer.errors import InputError


class ProfileError(InputError):
    """No profile can be built from the given source (no statistics, unreadable file)."""


class ExtrapolationError(InputError):
    """A prediction would need execution times for batch sizes the profile does not cover."""
