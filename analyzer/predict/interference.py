"""Instances on one device: how much their executions overlap (:class:`Overlap`), read from the
interference a probe measured at N instances (:func:`overlap_from_interference`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.predict.profile import BatchTiming


@dataclass(frozen=True)
class Overlap:
    """What bursts at several instances say about host work hidden in ``compute_infer``.

    ``N`` batches of one size that start together on ``N`` instances of one device finish
    their serialised part one after another: batch ``k`` (0-based) takes ``h + (k + 1) s``
    (``h`` overlapping host work, ``s`` serialised work), so their mean over the one-instance
    time ``h + s`` is ``ratio = 1 + share * (N - 1) / 2``, with ``share = s / (h + s)``. The
    share is taken at the upper end of its interval (the ratio + 2 standard errors over the
    bursts, robust ones: :func:`overlap_from_interference`), so noise never claims overlap
    that is not there; ``ms`` is what it leaves of
    ``compute_infer`` as host work (0 when ``compute_input`` and ``compute_output`` already
    hold all of it, as the reference server's statistics do).
    """

    ms: float
    serial_share: float
    ratio: float
    stderr: float
    batch_size: int
    instances: int
    bursts: int

    def describe(self) -> str:
        """One clause for a profile's provenance."""
        return (
            f"execution time x{self.ratio:.3f} +- {self.stderr:.3f} at {self.instances} "
            f"instances (batch {self.batch_size}, {self.bursts} bursts): serialised share <= "
            f"{self.serial_share:.2f}, so {self.ms:.2f} ms of compute_infer overlaps across "
            "instances"
        )


def overlap_from_interference(
    alone: BatchTiming, instances: int, ratios: Sequence[float]
) -> Overlap:
    """The :class:`Overlap` that bursts at ``instances`` instances measured (``ratios``: each
    burst's execution time over ``alone``, the one-instance time of the same size).

    The ratio is the bursts' median and its standard error the median's (``1.2533 * 1.4826 *
    MAD / sqrt(k)``): one burst that a scheduler hiccup stretched moves neither (a mean and a
    standard deviation it would, and a stretched burst in 24 was seen to hide all overlap).
    """
    k = len(ratios)
    median = statistics.median(ratios)
    stderr = float("inf")
    if k > 1:
        mad = statistics.median(abs(r - median) for r in ratios)
        stderr = 1.2533 * 1.4826 * mad / k**0.5
    share = 1.0
    if instances > 1 and stderr != float("inf"):
        share = min(1.0, max(0.0, 2.0 * (median + 2.0 * stderr - 1.0) / (instances - 1)))
    ms = max(0.0, alone.infer_ms - share * alone.total_ms)
    return Overlap(ms, share, median, stderr, alone.batch_size, instances, k)
