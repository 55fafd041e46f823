"""Locust load shapes (steady, ramp, spike, diurnal), selectable in the dashboard's form.

Each reads the form's user count, spawn rate and run time (``use_common_options``) and perfsweep's
``--shape-period-s`` / ``--spike-factor``; the curves themselves are ``profiles.py``. With
open-loop users the user count is the offered rate in units of ``--rate-per-user``.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
from typing import Any

from locust import LoadTestShape

from analyzer.load.web import profiles

#: A spike lasts this share of its period.
SPIKE_SHARE = 0.2


class _PerfsweepShape(LoadTestShape):
    abstract = True
    use_common_options = True

    def _options(self) -> Any:
        runner = self.runner
        return runner.environment.parsed_options if runner is not None else None

    def _opt(self, name: str, default: Any) -> Any:
        value = getattr(self._options(), name, None)
        return default if value in (None, "", 0) else value

    def tick(self) -> tuple[int, float] | None:
        """Users wanted now, or None when the form's run time is over."""
        t = self.get_run_time()
        run_time = self._opt("run_time", None)
        if run_time is not None and t > float(run_time):
            return None
        users = int(self._opt("num_users", 10))
        spawn_rate = float(self._opt("spawn_rate", users))
        wanted = self.users_at(t, users)
        # Changes must land within the shape's ~1 s tick, or a spike is smeared into a ramp.
        return wanted, max(spawn_rate, float(abs(wanted - self.get_current_user_count())), 1.0)

    def users_at(self, t: float, users: int) -> int:
        """Users ``t`` seconds into the test."""
        raise NotImplementedError

    @property
    def period_s(self) -> float:
        """The shape's time scale (``--shape-period-s``)."""
        return float(self._opt("shape_period_s", 60.0))


class SteadyShape(_PerfsweepShape):
    """Constant load: the form's user count, for the form's run time (or until stopped)."""

    def users_at(self, t: float, users: int) -> int:
        return profiles.steady(t, users)


class RampShape(_PerfsweepShape):
    """Linear ramp from 1 to the form's users over --shape-period-s, then hold."""

    def users_at(self, t: float, users: int) -> int:
        return profiles.ramp(t, users, self.period_s)


class SpikeShape(_PerfsweepShape):
    """The form's users, with a burst to users x --spike-factor at the end of every period."""

    def users_at(self, t: float, users: int) -> int:
        factor = float(self._opt("spike_factor", 3.0))
        return profiles.spike(t, users, self.period_s, factor, SPIKE_SHARE * self.period_s)


class DiurnalShape(_PerfsweepShape):
    """A day compressed into --shape-period-s: 20 % of the users at night, all of them at noon."""

    def users_at(self, t: float, users: int) -> int:
        return profiles.diurnal(t, users, self.period_s)


SHAPE_CLASSES = [SteadyShape, RampShape, SpikeShape, DiurnalShape]
