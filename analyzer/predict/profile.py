"""Execution time per batch size (and request size): the input of the simulator, and where its
numbers come from.

A :class:`Profile` holds, for each profiled batch size, the mean time of one execution split as
Triton's statistics split it: ``compute_input`` (host work before the device part),
``compute_infer`` (the device part, which instances on one device serialise) and
``compute_output`` (host work after it). Between profiled sizes it interpolates linearly; outside
them it refuses (:class:`~analyzer.predict.ExtrapolationError`).

Requests of several sizes (a variable sequence length, strings of several lengths) run in
batches padded to their longest member. A probed profile then carries the load's
:class:`RequestMix` (each kind of request: its size, its share of the requests, which others it
may share a batch with, and the batch items per request) and one :class:`SizeClass` per request
size it timed (the same batch sizes in each). A batch is timed at the size of its largest
member, interpolated linearly between timed sizes and between batch sizes, never beyond either;
``timings`` is then the mix's expected time per batch size (a batch of ``b`` items drawn from
the mix, timed at its largest member), the one-table view that rescaling, peak throughput and
older readers use. A profile without size classes is a one-class profile, as every profile
was before (files without ``size_classes``/``mix`` load as one).

Three builders, beside this module (``sources``: statistics, TOML; ``fitting``: a run
directory), all pure except for reading the file they are given (a fourth,
:func:`analyzer.predict.probe.probe`, measures a live server):

* :func:`from_statistics`: a statistics-extension document (``GET /v2/models/<m>/stats``, a
  reference server's or Triton's) — its ``batch_stats`` give ns and count per batch size.
* :func:`from_run_dir`: a perfsweep run directory, its trial records read with
  :func:`analyzer.rundir.records.load_trial`. Every level they measured (a capacity search's points,
  the fixed level, pareto's reference level) carries, per window, the server's executions per
  batch size and the per-request mean of each compute phase (every request of a batch reports
  the batch's time); a least-squares fit of ``a + c * batch`` per phase over those windows
  gives the profile, valid up to the largest batch size observed.
  ``compute_input`` of a multi-instance window includes waits for the device, so the input
  phase is fitted on the windows with the fewest instances; the ratio of the mean execution
  time at N instances to that at the fewest is kept as ``interference`` (information only: the
  simulator models the device serialisation itself).
* :func:`from_toml`: a simulated-device profile TOML (``reference_server/zoo/profiles``): the
  exact curves of the simulated backend, sampled at every batch size up to the table's last
  point (or ``max_batch_size``), with the profile's jitter.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analyzer.documents import FORMATS, PROFILE_KIND, header
from analyzer.predict import ExtrapolationError, ProfileError

KIND = PROFILE_KIND


@dataclass(frozen=True)
class BatchTiming:
    """Mean milliseconds of one execution of ``batch_size`` items, per phase.

    Attributes:
        batch_size: Total items in the execution.
        input_ms: ``compute_input`` (host, overlaps across instances).
        infer_ms: ``compute_infer`` (device, serialised across instances on one device).
        output_ms: ``compute_output`` (host, overlaps).
        executions: Executions behind the means (0 for a fitted or synthetic value).
    """

    batch_size: int
    input_ms: float
    infer_ms: float
    output_ms: float
    executions: int = 0

    @property
    def total_ms(self) -> float:
        """The whole execution."""
        return self.input_ms + self.infer_ms + self.output_ms

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "batch_size": self.batch_size,
            "input_ms": self.input_ms,
            "infer_ms": self.infer_ms,
            "output_ms": self.output_ms,
            "executions": self.executions,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchTiming:
        """Inverse of :meth:`to_dict`."""
        return cls(
            int(data["batch_size"]),
            float(data["input_ms"]),
            float(data["infer_ms"]),
            float(data["output_ms"]),
            int(data.get("executions", 0)),
        )


def _interpolated(timings: Sequence[BatchTiming], batch_size: int) -> BatchTiming:
    """The phases at ``batch_size``, linear between the (sorted) ``timings``; the caller has
    checked that it lies within them."""
    sizes = [t.batch_size for t in timings]
    i = bisect.bisect_left(sizes, batch_size)
    if sizes[i] == batch_size:
        return timings[i]
    lo, hi = timings[i - 1], timings[i]
    w = (batch_size - lo.batch_size) / (hi.batch_size - lo.batch_size)
    return _mixed(batch_size, ((1.0 - w, lo), (w, hi)))


def _mixed(batch_size: int, parts: Iterable[tuple[float, BatchTiming]]) -> BatchTiming:
    """The weighted sum of ``parts``' phases, as a timing of ``batch_size``."""
    i = f = o = 0.0
    for w, t in parts:
        i += w * t.input_ms
        f += w * t.infer_ms
        o += w * t.output_ms
    return BatchTiming(batch_size, i, f, o)


@dataclass(frozen=True)
class RequestKind:
    """One kind of request the load sends.

    Attributes:
        size: What the mix's measure counts for it (e.g. its sequence length).
        share: Its share of the requests (the kinds' shares sum to 1).
        key: Requests whose keys differ never share a batch (Triton batches inputs with a
            variable dim and no ``allow_ragged_batch`` only at equal shapes); None: it may
            join any batch.
    """

    size: int
    share: float
    key: int | None = None


@dataclass(frozen=True)
class RequestMix:
    """The requests of the load as the simulator draws them: each arrival's kind is drawn by
    share (the data's empirical mix).

    Attributes:
        measure: What a size counts, in words.
        kinds: The distinct (size, key) kinds, by size.
        items: Batch items per request (the load's batch size).
    """

    measure: str
    kinds: tuple[RequestKind, ...]
    items: int = 1

    def __post_init__(self) -> None:
        if not self.kinds or any(k.share <= 0 for k in self.kinds) or self.items < 1:
            raise ProfileError("a request mix needs kinds with positive shares and items >= 1")

    @classmethod
    def of(
        cls, measure: str, sizes: Sequence[int], keys: Sequence[Hashable], items: int = 1
    ) -> RequestMix:
        """The mix of a rotation: one entry per request (``sizes``, ``keys`` aligned)."""
        if not sizes:
            raise ProfileError("a request mix needs at least one request")
        ids: dict[Hashable, int] = {}
        counts: dict[tuple[int, int | None], int] = {}
        for size, key in zip(sizes, keys, strict=True):
            kid = None if key is None else ids.setdefault(key, len(ids))
            counts[(int(size), kid)] = counts.get((int(size), kid), 0) + 1
        total = len(sizes)
        kinds = tuple(
            RequestKind(size, n / total, kid)
            for (size, kid), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))
        )
        return cls(measure, kinds, items)

    @property
    def keyed(self) -> bool:
        """Some requests may not share a batch (their kinds carry keys)."""
        return any(k.key is not None for k in self.kinds)

    def same_shape_share(self) -> float | None:
        """The chance that an arrival has the shape (key) of the request ahead of it, requests
        drawn independently by share: what lets neighbours share a batch when shapes must match
        (None: any request may join any batch)."""
        if not self.keyed:
            return None
        shares: dict[int | None, float] = {}
        for k in self.kinds:
            shares[k.key] = shares.get(k.key, 0.0) + k.share
        return sum(s * s for s in shares.values())

    @property
    def sizes(self) -> tuple[int, ...]:
        """The distinct sizes, ascending."""
        return tuple(sorted({k.size for k in self.kinds}))

    def size_shares(self) -> list[tuple[int, float]]:
        """(size, share of the requests) per distinct size, ascending."""
        shares: dict[int, float] = {}
        for k in self.kinds:
            shares[k.size] = shares.get(k.size, 0.0) + k.share
        return sorted(shares.items())

    def quantile(self, q: float) -> int:
        """The smallest size at or above a share ``q`` of the requests."""
        acc = 0.0
        pairs = self.size_shares()
        for size, share in pairs:
            acc += share
            if acc >= q - 1e-12:
                return size
        return pairs[-1][0]

    def describe(self) -> str:
        """One clause for provenance and the console."""
        sizes = self.sizes
        spread = (
            f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} ({len(sizes)} sizes)"
        )
        return (
            f"request sizes {spread}, size = {self.measure}; {self.items} item(s) per request"
            + ("; requests of different shapes never share a batch" if self.keyed else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "measure": self.measure,
            "items": self.items,
            "kinds": [{"size": k.size, "share": k.share, "key": k.key} for k in self.kinds],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestMix:
        """Inverse of :meth:`to_dict`."""
        return cls(
            measure=str(data.get("measure", "")),
            items=int(data.get("items", 1)),
            kinds=tuple(
                RequestKind(
                    int(k["size"]),
                    float(k["share"]),
                    None if k.get("key") is None else int(k["key"]),
                )
                for k in data["kinds"]
            ),
        )


@dataclass(frozen=True)
class SizeClass:
    """Execution times of batches whose requests all have one size.

    Attributes:
        size: The request size (the mix's measure) every request of the timed batches had.
        timings: One entry per profiled batch size, sorted by size.
    """

    size: int
    timings: tuple[BatchTiming, ...]


@dataclass(frozen=True)
class Profile:
    """Execution times of one model on one server, with where they come from.

    Attributes:
        model: Model name.
        provenance: One paragraph: what was measured or read, how, and what is assumed.
        source: ``"statistics"`` | ``"run_dir"`` | ``"toml"`` | ``"probe"``.
        timings: One entry per profiled batch size, sorted by size.
        jitter: Relative standard deviation of every phase duration (0 = deterministic).
        instances_profiled: Instance count of the config the input phase was measured with.
        interference: Instance count -> mean execution time relative to ``instances_profiled``.
        latency_offset_ms: Latency outside the server's queue and execution (network, protocol,
            the generator's own delays), added to every simulated latency; 0 until calibrated
            on measured operating points (:func:`analyzer.predict.capacity.latency_offset`).
        overlap_ms: Host work inside ``compute_infer`` that overlaps across instances (a
            backend that reports its whole execution as ``compute_infer``, as Triton's Python
            backend does); measured by the interference probe
            (:func:`overlap_from_interference`). :meth:`table` moves it from the device phase
            to the input phase, so the simulator serialises only the rest.
        classes: Timings per request size (several sizes: the probe of a mixed load; empty:
            a one-class profile). With classes, ``timings`` is computed: the mix's expected
            time per batch size (whatever was passed is replaced).
        mix: The requests the load sends (sizes, shares, batching keys, items per request);
            None: alike requests of one item.
        serial_share: The share of an execution the device serialises across instances, as
            the interference probe measured it (:attr:`Overlap.serial_share
            <analyzer.predict.interference.Overlap>`); None: not measured. Above 0 it says
            the instances share one device (:attr:`shares_device`, :meth:`device_rps`).
        overlap_batch: The batch size ``overlap_ms`` was measured at (the interference
            probe's); None: not known. With size classes the host work inside
            ``compute_infer`` is taken per request, as a Python backend handles each request
            of a batch: ``overlap_ms x b / overlap_batch`` at batch size ``b`` (a constant
            measured at a batch of 8 would erase a batch of 1's device time and predict
            configs above what the device serves).
    """

    model: str
    provenance: str
    source: str
    timings: tuple[BatchTiming, ...]
    jitter: float = 0.0
    instances_profiled: int = 1
    interference: Mapping[int, float] = field(default_factory=dict)
    latency_offset_ms: float = 0.0
    overlap_ms: float = 0.0
    classes: tuple[SizeClass, ...] = ()
    mix: RequestMix | None = None
    serial_share: float | None = None
    overlap_batch: int | None = None

    def __post_init__(self) -> None:
        if self.classes:
            self._check_classes()
            object.__setattr__(self, "timings", self._expected_timings())
        if not self.timings:
            raise ProfileError(f"profile of {self.model!r} has no batch sizes")
        sizes = [t.batch_size for t in self.timings]
        if sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise ProfileError(f"profile of {self.model!r}: batch sizes must be distinct, >= 1")
        # The simulator's tables per largest batch (not a field: equality ignores it).
        object.__setattr__(self, "_tables", {})

    def _check_classes(self) -> None:
        sizes = [c.size for c in self.classes]
        if sizes != sorted(set(sizes)):
            raise ProfileError(f"profile of {self.model!r}: size classes must be distinct")
        batches = [t.batch_size for t in self.classes[0].timings]
        if not batches or any([t.batch_size for t in c.timings] != batches for c in self.classes):
            raise ProfileError(
                f"profile of {self.model!r}: every size class must time the same batch sizes"
            )
        if self.mix is None:
            raise ProfileError(f"profile of {self.model!r}: size classes need the request mix")
        outside = [s for s in self.mix.sizes if not sizes[0] <= s <= sizes[-1]]
        if outside:
            raise ProfileError(
                f"profile of {self.model!r} timed request sizes {sizes[0]}-{sizes[-1]}, but the "
                f"load sends sizes {outside[0]}..: predictions do not extrapolate"
            )

    @property
    def items(self) -> int:
        """Batch items per request of the load (the mix's; 1 without one)."""
        return self.mix.items if self.mix is not None else 1

    def _class_timing(self, batch_size: int, size: int) -> BatchTiming:
        """The phases at ``batch_size`` for batches padded to ``size`` (linear in both)."""
        if not self.classes:
            return self.timing(batch_size)
        sizes = [c.size for c in self.classes]
        if size < sizes[0] or size > sizes[-1]:
            raise ExtrapolationError(
                f"request size {size} is outside the profiled {sizes[0]}-{sizes[-1]}"
            )
        i = bisect.bisect_left(sizes, size)
        if sizes[i] == size:
            return _interpolated(self.classes[i].timings, batch_size)
        lo, hi = self.classes[i - 1], self.classes[i]
        w = (size - lo.size) / (hi.size - lo.size)
        return _mixed(
            batch_size,
            (
                (1.0 - w, _interpolated(lo.timings, batch_size)),
                (w, _interpolated(hi.timings, batch_size)),
            ),
        )

    def _largest_shares(self, batch_size: int) -> list[tuple[int, float]]:
        """(size, probability that it is the largest member) of a batch of ``batch_size``
        items drawn from the mix (keyed: a batch holds one kind, so the draw of its first)."""
        assert self.mix is not None
        pairs = self.mix.size_shares()
        if self.mix.keyed:
            return pairs
        n = max(1, math.ceil(batch_size / self.mix.items))
        out, below = [], 0.0
        for size, share in pairs:
            upto = min(1.0, below + share)
            out.append((size, upto**n - below**n))
            below = upto
        return out

    def _expected_timings(self) -> tuple[BatchTiming, ...]:
        """Per profiled batch size: the mix's expected phases, each batch timed at its largest
        member (the one-table view of a profile with size classes)."""
        out = []
        for at, row in enumerate(self.classes[0].timings):
            b = row.batch_size
            mixed = _mixed(b, ((w, self._class_timing(b, s)) for s, w in self._largest_shares(b)))
            executions = sum(c.timings[at].executions for c in self.classes)
            out.append(replace(mixed, executions=executions))
        return tuple(out)

    @property
    def min_batch_size(self) -> int:
        """Smallest profiled batch size."""
        return self.timings[0].batch_size

    @property
    def max_batch_size(self) -> int:
        """Largest profiled batch size: no prediction may need a larger one."""
        return self.timings[-1].batch_size

    def check_covers(self, largest: int) -> None:
        """Raise :class:`ExtrapolationError` unless every batch a config with batches of up to
        ``largest`` items can execute is covered (multiples of :attr:`items` up to it)."""
        items = self.items
        top = largest // items * items
        if top < items:
            raise ExtrapolationError(
                f"a batch of at most {largest} item(s) cannot hold one request of the load "
                f"({items} items): the server refuses such requests"
            )
        if self.min_batch_size > items or top > self.max_batch_size:
            raise ExtrapolationError(
                f"the profile of {self.model!r} covers batch sizes {self.min_batch_size}-"
                f"{self.max_batch_size}, but this config can execute batches of {items}-{top}; "
                "predictions do not extrapolate: choose max_batch_size <= "
                f"{self.max_batch_size} or profile larger batches (a run that reaches them)"
            )

    def covers(self, largest: int) -> bool:
        """Whether :meth:`check_covers` passes."""
        try:
            self.check_covers(largest)
        except ExtrapolationError:
            return False
        return True

    def timing(self, batch_size: int, size: int | None = None) -> BatchTiming:
        """The phases at ``batch_size``, interpolated linearly between profiled sizes: of
        batches padded to request size ``size`` (a profile with size classes), else the
        profile's one table (with size classes: the mix's expected time)."""
        sizes = [t.batch_size for t in self.timings]
        if batch_size < sizes[0] or batch_size > sizes[-1]:
            raise ExtrapolationError(
                f"batch size {batch_size} is outside the profiled {sizes[0]}-{sizes[-1]}"
            )
        if size is not None and self.classes:
            return self._class_timing(batch_size, size)
        return _interpolated(self.timings, batch_size)

    def _rows(self, largest: int, at: Callable[[int], BatchTiming]) -> list[BatchTiming]:
        """``at(b)`` for b in ``0..largest`` (index = size; sizes no batch can have, below
        one request or above the largest multiple of it, hold a neighbour), overlap moved."""
        lo, hi = self.min_batch_size, self.max_batch_size
        rows = [at(lo), *(at(min(max(b, lo), hi)) for b in range(1, largest + 1))]
        if self.overlap_ms <= 0:
            return rows
        return [
            replace(t, input_ms=t.input_ms + moved, infer_ms=t.infer_ms - moved)
            for t in rows
            for moved in (self._host_in_infer(t),)
        ]

    @property
    def shares_device(self) -> bool:
        """The interference probe measured instances that serialise on one device."""
        return self.serial_share is not None and self.serial_share > 0

    def _host_in_infer(self, t: BatchTiming) -> float:
        """The host work the simulator moves out of ``t``'s device phase (it overlaps across
        instances): ``overlap_ms``; with size classes and a known :attr:`overlap_batch`, per
        request, so in proportion to ``t``'s batch size. Never more than ``compute_infer``."""
        moved = self.overlap_ms
        if self.classes and self.overlap_batch:
            moved = self.overlap_ms * t.batch_size / self.overlap_batch
        return min(moved, t.infer_ms)

    def table(self, largest: int) -> list[BatchTiming]:
        """Timings for sizes ``0..largest`` as the simulator runs them (index = size; entry 0
        is unused): :attr:`overlap_ms` moved from the device phase to the input phase."""
        self.check_covers(largest)
        return self._rows(largest, self.timing)

    def size_tables(self, largest: int) -> tuple[list[list[BatchTiming]], tuple[int, ...]]:
        """The simulator's tables: one :meth:`table` per distinct request size of the mix
        (ascending, so a larger row index is a larger size), and each mix kind's row (a
        one-class profile: one table, every kind on row 0). Computed once per ``largest``."""
        memo: dict[int, tuple[list[list[BatchTiming]], tuple[int, ...]]] = self.__dict__["_tables"]
        if largest not in memo:
            self.check_covers(largest)
            kinds = self.mix.kinds if self.mix is not None else ()
            if not self.classes:
                memo[largest] = ([self._rows(largest, self.timing)], tuple(0 for _ in kinds))
            else:
                sizes = sorted({k.size for k in kinds})
                tables = [
                    self._rows(largest, functools.partial(self._class_timing, size=s))
                    for s in sizes
                ]
                memo[largest] = (tables, tuple(sizes.index(k.size) for k in kinds))
        return memo[largest]

    def peak_rps(self, largest: int, instances: int = 1) -> float:
        """Noise-free upper bound on throughput with batches up to ``largest`` (device-bound
        unless host work per instance dominates); never above :meth:`device_rps` when the
        instances share one device."""
        best = 0.0
        for t in self.table(largest)[1:]:
            cycle = max(t.infer_ms, t.total_ms / max(1, instances))
            if cycle > 0:
                best = max(best, 1000.0 * t.batch_size / cycle)
        device = self.device_rps(largest)
        return best if device is None else min(best, device)

    def device_rps(self, largest: int) -> float | None:
        """The device's serial throughput at the data's sizes with batches up to ``largest``:
        requests per second when the device does nothing but the serialised part of every
        execution, back to back (each batch size's mean over the sizes its batches are timed
        at, as the simulator draws them; the best batch size). None unless the instances share
        one device (:attr:`shares_device`): then no config serves more, however many
        instances it has."""
        if not self.shares_device:
            return None
        tables, _ = self.size_tables(largest)
        sizes = sorted({k.size for k in self.mix.kinds}) if self.mix is not None else []
        items = self.items
        best = 0.0
        for b in range(items, largest // items * items + 1, items):
            if self.classes:
                device = sum(
                    share * tables[sizes.index(size)][b].infer_ms
                    for size, share in self._largest_shares(b)
                )
            else:
                device = tables[0][b].infer_ms
            if device > 0:
                best = max(best, 1000.0 * b / device)
        return best if best > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document (``perfsweep predict --profile`` reads it back)."""
        return {
            **header(KIND),
            "model": self.model,
            "provenance": self.provenance,
            "source": self.source,
            "jitter": self.jitter,
            "instances_profiled": self.instances_profiled,
            "interference": {str(k): v for k, v in sorted(self.interference.items())},
            "latency_offset_ms": self.latency_offset_ms,
            "overlap_ms": self.overlap_ms,
            **({"serial_share": self.serial_share} if self.serial_share is not None else {}),
            **({"overlap_batch": self.overlap_batch} if self.overlap_batch is not None else {}),
            "timings": [t.to_dict() for t in self.timings],
            **({"mix": self.mix.to_dict()} if self.mix is not None else {}),
            **(
                {
                    "size_classes": [
                        {"size": c.size, "timings": [t.to_dict() for t in c.timings]}
                        for c in self.classes
                    ]
                }
                if self.classes
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """Inverse of :meth:`to_dict`; refuses other kinds and format versions."""
        fmt = FORMATS[KIND]
        if data.get("kind") != KIND or not fmt.readable(data.get("format_version")):
            raise ProfileError(
                f"not a perfsweep profile of format version {fmt.current} (kind "
                f"{data.get('kind')!r}, format_version {data.get('format_version')!r}); "
                "write it again with this perfsweep version"
            )
        data = fmt.lift(data, KIND)
        try:
            return cls(
                model=str(data["model"]),
                provenance=str(data["provenance"]),
                source=str(data["source"]),
                timings=tuple(BatchTiming.from_dict(t) for t in data["timings"]),
                jitter=float(data.get("jitter", 0.0)),
                instances_profiled=int(data.get("instances_profiled", 1)),
                interference={int(k): float(v) for k, v in data.get("interference", {}).items()},
                latency_offset_ms=float(data.get("latency_offset_ms", 0.0)),
                overlap_ms=float(data.get("overlap_ms", 0.0)),
                # Absent in a profile written before it was kept: not measured.
                serial_share=(
                    None if data.get("serial_share") is None else float(data["serial_share"])
                ),
                overlap_batch=(
                    None if data.get("overlap_batch") is None else int(data["overlap_batch"])
                ),
                # Both absent in a profile written before size classes: one class.
                classes=tuple(
                    SizeClass(int(c["size"]), tuple(BatchTiming.from_dict(t) for t in c["timings"]))
                    for c in data.get("size_classes", ())
                ),
                mix=RequestMix.from_dict(data["mix"]) if data.get("mix") else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"malformed profile document: {exc!r}") from exc


def save_profile(profile: Profile, path: Path) -> None:
    """Write ``profile`` as JSON."""
    Path(path).write_text(json.dumps(profile.to_dict(), indent=2) + "\n", encoding="utf-8")


def load_profile(path: Path) -> Profile:
    """Read a profile JSON file (as :func:`save_profile` writes it)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path} is not a perfsweep profile (not a JSON object)")
    return Profile.from_dict(data)
