"""Load profiles over time (pure): how many users a shape wants ``t`` seconds into a test.

The Locust ``LoadTestShape`` classes in ``shapes.py`` are thin wrappers around these functions, so
the arithmetic is unit-tested without Locust. For open-loop users (each offers a fixed rate) the
user count *is* the offered load, so these curves are also request-rate curves.
"""

from __future__ import annotations

import math


def steady(t: float, users: int) -> int:
    """Constant ``users``."""
    return users


def ramp(t: float, users: int, ramp_s: float) -> int:
    """Linear from 0 to ``users`` over ``ramp_s`` seconds, then hold (at least one user)."""
    if ramp_s <= 0:
        return users
    return max(1, min(users, math.ceil(users * t / ramp_s)))


def spike(t: float, users: int, period_s: float, factor: float, spike_s: float) -> int:
    """``users``, with a burst to ``users * factor`` for ``spike_s`` at the end of every period.

    The first period is calm, so the baseline is visible before the first spike.
    """
    if period_s <= 0:
        return users
    in_period = t % period_s
    if in_period >= period_s - spike_s:
        return max(users, round(users * factor))
    return users


def diurnal(t: float, users: int, period_s: float, low_fraction: float = 0.2) -> int:
    """A compressed day: a cosine from ``low_fraction * users`` (night) up to ``users`` (noon)."""
    if period_s <= 0:
        return users
    level = low_fraction + (1 - low_fraction) * (1 - math.cos(2 * math.pi * t / period_s)) / 2
    return max(1, round(users * level))
