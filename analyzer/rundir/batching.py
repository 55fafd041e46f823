"""Batch formation: what the trials' server statistics say about the batches the knobs made.

Every trial's operating point carries the server's batch-size histogram (executions per batch
size) and its mean batch size; :func:`batch_formation` reads them beside each trial's configured
``max_batch_size`` and says whether the batching knobs did anything at all. When no trial formed
batches (mean batch near 1 although the config allowed more), the delay, the preferred sizes and
the max batch size are inert: the run's figures differ by instance count and noise only. The
usual cause on a variable-length model is the shapes: Triton's dynamic batcher puts requests in
one batch only when their variable-dim inputs have the same shape (unless the input sets
``allow_ragged_batch``), and in random order two neighbours rarely match. ``same_shape_share``
(the chance that an arrival has the shape of the request ahead of it, from the load's own data)
says how rarely.

summary.json's ``batching`` is :meth:`BatchFormation.to_dict`; the console and the report print
its ``note``. Before any trial, the load's data alone can say it (:func:`batches_cannot_form`): a
batch is a run of equal shapes at the head of the queue, whose mean length is ``1 / (1 - share)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from analyzer.config.knobs import Knobs
from analyzer.rundir.trial_record import TrialRecord

__all__ = [
    "INERT_MEAN_BATCH",
    "BatchFormation",
    "TrialBatches",
    "batch_formation",
    "batches_cannot_form",
    "inert_before_trials",
    "trial_batches",
]

#: A trial whose mean batch is below this formed no batches to speak of.
INERT_MEAN_BATCH = 1.2

#: Trials that could batch (max batch >= 2, dynamic batching) an "inert" verdict needs.
INERT_MIN_TRIALS = 1


@dataclass(frozen=True)
class TrialBatches:
    """One trial's batches at its operating point."""

    number: int
    max_batch_size: int
    mean_batch_size: float
    histogram: dict[int, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.number,
            "max_batch_size": self.max_batch_size,
            "mean_batch_size": round(self.mean_batch_size, 3),
            "batch_sizes": {str(k): v for k, v in sorted(self.histogram.items())},
        }


@dataclass(frozen=True)
class BatchFormation:
    """What the run's batches were.

    Attributes:
        trials: Per trial that could batch and whose server reported statistics.
        inert: No trial formed batches: the batching knobs made no difference.
        same_shape_share: The share of arrivals whose shape matches the request ahead of them
            (None: every request may join any batch, or not known).
        note: One sentence for the console and the report (None: nothing to say).
    """

    trials: tuple[TrialBatches, ...]
    inert: bool
    same_shape_share: float | None
    note: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "inert": self.inert,
            "same_shape_share": (
                None if self.same_shape_share is None else round(self.same_shape_share, 4)
            ),
            "note": self.note,
            "trials": [t.to_dict() for t in self.trials],
        }


def trial_batches(record: TrialRecord) -> TrialBatches | None:
    """The batches one trial's config formed at its operating point; None when the config
    cannot batch (no dynamic batcher, max batch 1, a pipeline's knobs) or the server reported
    no statistics."""
    knobs = record.config
    if not isinstance(knobs, Knobs) or not knobs.dynamic_batching or knobs.max_batch_size < 2:
        return None
    point = record.operating_point()
    server = point.server if point is not None else None
    if server is None or server.execution_count <= 0:
        return None
    return TrialBatches(
        record.number, knobs.max_batch_size, server.avg_batch_size, dict(server.batch_sizes)
    )


def batch_formation(
    records: Iterable[TrialRecord], same_shape_share: float | None = None
) -> BatchFormation | None:
    """The batches the trials formed, and whether the batching knobs were inert.

    Args:
        records: The run's trials (the baseline included; pipelines' trials are left out: each
            stage batches on its own).
        same_shape_share: From the load's data (:meth:`~analyzer.predict.profile.RequestMix.
            same_shape_share`); None when unknown or when any request may join any batch.

    Returns:
        None when no trial that could batch reported the server's statistics.
    """
    seen = [
        t
        for r in sorted(records, key=lambda r: r.number)
        if r.state == "complete" and (t := trial_batches(r)) is not None
    ]
    if not seen:
        return None
    inert = len(seen) >= INERT_MIN_TRIALS and all(
        t.mean_batch_size < INERT_MEAN_BATCH for t in seen
    )
    return BatchFormation(
        tuple(seen), inert, same_shape_share, _note(seen, inert, same_shape_share)
    )


def _note(seen: list[TrialBatches], inert: bool, share: float | None) -> str | None:
    if not inert:
        return None
    largest = max(t.max_batch_size for t in seen)
    mean = max(t.mean_batch_size for t in seen)
    trials = "the one trial" if len(seen) == 1 else f"all {len(seen)} trials"
    head = (
        f"batches did not form: in {trials} that allowed batches (max batch up "
        f"to {largest}) the mean batch was at most {mean:.2f}, so the queue delay, preferred "
        "sizes and max batch size made no difference"
    )
    if share is not None:
        return f"{head}. {_why_and_ways_out(share)}"
    return (
        f"{head}. Why: either the requests' shapes differ (inputs with a variable dimension "
        "batch only at equal shapes, unless allow_ragged_batch) or requests never waited "
        "together in the queue"
    )


def _why_and_ways_out(share: float) -> str:
    """Why requests of a variable-length load do not batch, and the two ways out."""
    return (
        "Why: the requests' shapes differ, and Triton batches inputs with a variable dimension "
        f"only at equal shapes; {share:.0%} of arrivals have the shape of the request ahead of "
        "them. What would let them batch: allow_ragged_batch on the variable inputs "
        "(--ragged-batch search; the backend must accept ragged batches), or padding requests "
        "to a few lengths on the client (--pad-buckets auto --pad-values NAME=0,...)"
    )


def batches_cannot_form(same_shape_share: float | None) -> bool:
    """The load's data alone says batches cannot form: requests of different shapes never
    share a batch, and a run of equal shapes at the head of the queue (``1 / (1 - share)``
    long on average, arrivals drawn independently) is below :data:`INERT_MEAN_BATCH`.

    Args:
        same_shape_share: :meth:`~analyzer.predict.profile.RequestMix.same_shape_share` (None:
            any request may join any batch).
    """
    if same_shape_share is None or same_shape_share >= 1.0:
        return False
    return 1.0 / (1.0 - same_shape_share) < INERT_MEAN_BATCH


def inert_before_trials(same_shape_share: float) -> str:
    """What the console says before trial 0 when :func:`batches_cannot_form`."""
    mean = 1.0 / (1.0 - same_shape_share)
    return (
        f"batches cannot form (a mean batch of about {mean:.2f} at any load), so the queue "
        "delay, preferred sizes and max batch size cannot matter: the search measures the "
        f"instance count only. {_why_and_ways_out(same_shape_share)}"
    )
