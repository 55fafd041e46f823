"""Predict-then-verify: a profile of the server's execution times and a simulator of its batcher.

::

    profile.py    Profile (execution time per batch size, and per request size of the
                  load's mix, provenance, JSON), built from a statistics document, a run
                  directory's trial measurements, or a bundled simulated-device TOML (or by
                  probe.py); refuses batch and request sizes it did not profile
    sources.py    from_statistics (a statistics document), from_toml (a simulated device)
    fitting.py    from_run_dir: a profile fitted from a run directory's measured windows
    interference.py  Overlap: how instances on one device overlap
    probe.py      probe(target, inputs=...) -> Profile: the profile phase against a live
                  server with the load's own request data (batches of chosen sizes forced with
                  max_batch_size = preferred = b and a long delay, at a few request sizes of
                  the data, times from batch_stats deltas, interference at N instances)
    probe_plan.py  ProbePlan, geometric_sizes, probe_config: what the probe measures
    simulator.py  simulate() -> Prediction at one rate; drives the reference server's own
                  ``reference_server.batching.decide.decide``
    sim_records.py  SimConfig, Prediction, CapacityPrediction
    capacity.py   capacity() -> the highest rate whose simulated p99 meets a goal
                  (bisection, or a bracket around a start), capacities() -> every config of
                  a space, latency_offset()
    planner.py    PlanRequest -> plan() -> PlanReport (``perfsweep predict``)

Errors (both :class:`analyzer.errors.InputError`, exit 2): :class:`ExtrapolationError` (a
config needs a batch size beyond the profiled ones) and :class:`ProfileError` (no profile can
be built from what was given).

Layer 8 of ``analyzer`` (``docs/internals.md``), with ``search`` (whose strategy consults it):
imports ``evaluation`` and the layers below it.
"""

from __future__ import annotations

from analyzer.errors import InputError


class ProfileError(InputError):
    """No profile can be built from the given source (no statistics, unreadable file)."""


class ExtrapolationError(InputError):
    """A prediction would need execution times for batch sizes the profile does not cover."""
