"""One capacity driver for open and closed loop, behind the ``LoadGenerator`` seam.

Open loop (``step.mode`` request rate): the generator's own search
(:meth:`~analyzer.measure.generator.LoadGenerator.find_capacity`), which can stop a level early and
drain the server between levels. Closed loop (concurrency): the same
:class:`~analyzer.measure.capacity.CapacitySearch` over whole user counts, each level one
:meth:`~analyzer.measure.generator.LoadGenerator.measure`; its capacity is the throughput of the
best passing level. Both answer a :class:`~analyzer.measure.capacity.CapacityResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from analyzer.measure.capacity import CapacityResult, CapacitySearch
from analyzer.measure.generator import LoadGenerator
from analyzer.measure.goals import meets_goals
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import CapacitySpec, LoadMode


class CapacityDriver:
    """Finds the highest load a loaded config serves within the goals.

    Args:
        load: The load generator.
        on_phase: Told what is being measured (the live view).
    """

    def __init__(
        self, load: LoadGenerator, on_phase: Callable[[str], None] = lambda text: None
    ) -> None:
        self.load = load
        self.on_phase = on_phase

    def run(self, spec: CapacitySpec) -> CapacityResult:
        """The capacity search ``spec`` describes (its ``step.mode`` says open or closed loop).

        Closed loop: ``start_rps``/``max_rps``/``min_rps`` are user counts, and ``capacity_rps``
        of the result is the best passing level's throughput, not its user count.
        """
        if spec.step.mode is LoadMode.REQUEST_RATE:
            self.on_phase(f"capacity search from {spec.start_rps:.0f} req/s")
            return self.load.find_capacity(spec)
        return self._closed_loop(spec)

    def _closed_loop(self, spec: CapacitySpec) -> CapacityResult:
        goals = spec.goals
        search = CapacitySearch(spec)
        points: list[Measurement] = []
        tried: dict[int, bool] = {}
        while (level := search.next_rate()) is not None:
            users = max(1, round(level))
            if users in tried:  # integer levels: the bracket cannot narrow further
                break
            self.on_phase(f"concurrency {users}")
            step = replace(spec.step, target=float(users), fail_fast=goals)
            m = self.load.measure(step)
            points.append(m)
            if spec.confirm_failures and not meets_goals(m, goals)[0]:
                self.on_phase(f"concurrency {users}: confirming a failing level")
                m = self.load.measure(step)
                points.append(m)
            tried[users] = meets_goals(m, goals)[0]
            search.record(level, tried[users])
        passing = [m for m in points if meets_goals(m, goals)[0]]
        best = max(passing, key=lambda m: m.throughput_rps, default=None)
        return CapacityResult(
            goals, best.throughput_rps if best else 0.0, tuple(points), best, search.bracketed
        )
