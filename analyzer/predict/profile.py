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

Three builders here, all pure except for reading the file they are given (a fourth,
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
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.documents import FORMATS, PROFILE_KIND, header
from analyzer.errors import ResultFormatError
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadMode
from analyzer.predict import ExtrapolationError, ProfileError
from analyzer.rundir import records
from analyzer.rundir.measurements import TrialMeasurement
from analyzer.rundir.results import RunDirectory
from analyzer.rundir.trial_record import TrialRecord

if TYPE_CHECKING:
    from analyzer.config.knobs import Knobs

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
            on measured operating points (:func:`analyzer.predict.simulator.latency_offset`).
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
            replace(
                t,
                input_ms=t.input_ms + min(self.overlap_ms, t.infer_ms),
                infer_ms=max(0.0, t.infer_ms - self.overlap_ms),
            )
            for t in rows
        ]

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
        unless host work per instance dominates)."""
        best = 0.0
        for t in self.table(largest)[1:]:
            cycle = max(t.infer_ms, t.total_ms / max(1, instances))
            if cycle > 0:
                best = max(best, 1000.0 * t.batch_size / cycle)
        return best

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
                # Both absent in a profile written before size classes: one class.
                classes=tuple(
                    SizeClass(int(c["size"]), tuple(BatchTiming.from_dict(t) for t in c["timings"]))
                    for c in data.get("size_classes", ())
                ),
                mix=RequestMix.from_dict(data["mix"]) if data.get("mix") else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"malformed profile document: {exc!r}") from exc


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


# ------------------------------------------------------------------ from a statistics document


def from_statistics(
    doc: Mapping[str, Any],
    model: str,
    *,
    instances: int = 1,
    server: str = "server",
    jitter: float = 0.0,
) -> Profile:
    """Build a profile from a statistics-extension document's ``batch_stats``.

    Args:
        doc: ``{"model_stats": [...]}`` (HTTP JSON, or tritonclient.grpc's ``as_json``).
        model: Model name (all its versions are summed).
        instances: Instance count the statistics were taken with.
        server: How the provenance names the server (e.g. its URL and version).
        jitter: Relative standard deviation to assume (statistics carry only means).

    Raises:
        ProfileError: the document has no executions of ``model``.
    """
    sums: dict[int, list[int]] = {}  # size -> [count, input ns, infer ns, output ns]
    for entry in doc.get("model_stats", []):
        if entry.get("name") != model:
            continue
        for b in entry.get("batch_stats", []):
            size = int(b.get("batch_size", 0))
            count = int(b.get("compute_infer", {}).get("count", 0))
            if size < 1 or count < 1:
                continue
            acc = sums.setdefault(size, [0, 0, 0, 0])
            acc[0] += count
            for i, key in enumerate(("compute_input", "compute_infer", "compute_output"), 1):
                acc[i] += int(b.get(key, {}).get("ns", 0))
    if not sums:
        raise ProfileError(
            f"the statistics have no executions of model {model!r} per batch size: send it "
            "traffic first (batch_stats fill as batches execute)"
        )
    timings = tuple(
        BatchTiming(size, i / n / 1e6, f / n / 1e6, o / n / 1e6, n)
        for size, (n, i, f, o) in sorted(sums.items())
    )
    total = sum(t.executions for t in timings)
    return Profile(
        model=model,
        provenance=(
            f"measured: batch_stats of {server} ({total} executions, {instances} instance(s)); "
            "means per batch size, compute_infer taken as the device part"
        ),
        source="statistics",
        timings=timings,
        jitter=jitter,
        instances_profiled=instances,
    )


# ------------------------------------------------------------------ from a simulated-device TOML


def from_toml(ref: str | Path, *, max_batch_size: int | None = None, model: str = "") -> Profile:
    """The simulated backend's own curves (bundled name or path), sampled at every size.

    Args:
        ref: Bundled profile name (``resnet50_sim``) or a path to a profile TOML.
        max_batch_size: Largest size to cover (default: the last table point; required for a
            linear ``a_ms + b_ms * batch`` profile without a table).
        model: Model name to record (default: the profile's name).
    """
    from reference_server.core.errors import ModelConfigError
    from reference_server.zoo.profiles import resolve_profile

    try:
        lat = resolve_profile(str(ref))
    except ModelConfigError as exc:
        raise ProfileError(str(exc)) from exc
    if max_batch_size is None:
        ends = [int(c.points[-1][0]) for c in (lat.device, lat.host_pre, lat.host_post) if c.points]
        if not ends:
            raise ProfileError(
                f"profile {lat.name} is linear (no table): give max_batch_size to bound it"
            )
        max_batch_size = max(ends)
    timings = tuple(
        BatchTiming(b, lat.host_pre.ms(b), lat.device.ms(b), lat.host_post.ms(b))
        for b in range(1, max_batch_size + 1)
    )
    return Profile(
        model=model or lat.name,
        provenance=f"simulated-device profile {lat.name}: {' '.join(lat.provenance.split())}",
        source="toml",
        timings=timings,
        jitter=lat.jitter,
    )


# ------------------------------------------------------------------ from a run directory


@dataclass(frozen=True)
class WindowSample:
    """One window of a trial as the fit sees it."""

    instances: int
    #: batch size -> executions.
    batch_sizes: Mapping[int, int]
    input_us: float
    infer_us: float
    output_us: float


def _request_weighted_x(batch_sizes: Mapping[int, int]) -> float:
    # A request's compute time is its batch's; averaging over requests weights a batch of b by
    # b, so the per-request mean of a + c*b is a + c * sum(n b^2) / sum(n b).
    items = sum(n * b for b, n in batch_sizes.items())
    return sum(n * b * b for b, n in batch_sizes.items()) / items if items else 0.0


def _fit_line(points: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least squares y = a + c x; points are (x, y, weight). One distinct x: c = 0."""
    sw = sum(w for _, _, w in points)
    mx = sum(x * w for x, _, w in points) / sw
    my = sum(y * w for _, y, w in points) / sw
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    if sxx <= 1e-9 * sw:
        return my, 0.0
    c = sum(w * (x - mx) * (y - my) for x, y, w in points) / sxx
    return my - c * mx, c


def fit_windows(samples: Iterable[WindowSample], model: str, where: str) -> Profile:
    """Fit ``a + c * batch`` per phase over window samples (see the module docstring)."""
    usable = [s for s in samples if s.batch_sizes and s.infer_us > 0]
    if not usable:
        raise ProfileError(
            f"{where}: no trial window carries the server's batch statistics (executions per "
            "batch size and compute times); run against a server with the statistics extension, "
            "or give --profile FILE"
        )
    fewest = min(s.instances for s in usable)
    base = [s for s in usable if s.instances == fewest]

    def points(group: list[WindowSample], attr: str) -> list[tuple[float, float, float]]:
        return [
            (
                _request_weighted_x(s.batch_sizes),
                getattr(s, attr) / 1000.0,
                float(sum(n * b for b, n in s.batch_sizes.items())),
            )
            for s in group
        ]

    # The device and output phases do not include waits for other instances: use every window.
    fits = {
        "input_ms": _fit_line(points(base, "input_us")),
        "infer_ms": _fit_line(points(usable, "infer_us")),
        "output_ms": _fit_line(points(usable, "output_us")),
    }
    largest = max(max(s.batch_sizes) for s in usable)
    executions: dict[int, int] = {}
    for s in usable:
        for b, n in s.batch_sizes.items():
            executions[b] = executions.get(b, 0) + n

    def at(key: str, b: int) -> float:
        a, c = fits[key]
        return max(0.0, a + c * b)

    timings = tuple(
        BatchTiming(
            b, at("input_ms", b), at("infer_ms", b), at("output_ms", b), executions.get(b, 0)
        )
        for b in range(1, largest + 1)
    )
    interference: dict[int, float] = {}
    base_total = _mean_total(base)
    for n in sorted({s.instances for s in usable} - {fewest}):
        group = [s for s in usable if s.instances == n]
        # Compare at the batch mix each group ran: observed / what the base fit predicts.
        predicted = _mean_total_predicted(group, fits)
        if predicted > 0 and base_total > 0:
            interference[n] = _mean_total(group) / predicted
    fitted = ", ".join(f"{k[:-3]} {a:.3f} + {c:.4f}*b ms" for k, (a, c) in fits.items())
    return Profile(
        model=model,
        provenance=(
            f"measured: {where}, {len(usable)} windows' server statistics; per-phase least-"
            f"squares fit ({fitted}) over request-weighted batch mixes; input phase from the "
            f"{len(base)} windows with {fewest} instance(s); executions observed up to batch "
            f"{largest}; no jitter assumed"
        ),
        source="run_dir",
        timings=timings,
        jitter=0.0,
        instances_profiled=fewest,
        interference=interference,
    )


def rescaled(profile: Profile, samples: Iterable[WindowSample], where: str) -> Profile:
    """``profile`` with each phase scaled to what a run's windows measured under load.

    One factor per phase: the windows' per-request mean of that phase over what ``profile``
    predicts for the same batch mixes (request-weighted, as :func:`fit_windows` weighs them),
    summed over windows by their requests. The profile's shape over batch sizes (a probe's
    exact per-size times) is kept and only its level moves, which every window determines;
    a line fitted through windows whose batch mixes cluster at a few large sizes is not
    determined at the small ones (a baseline at batch 9-16 gave ``32 + 0.43 * b`` ms where
    the probe had measured 13.8 ms at batch 1). Only the windows with the fewest instances
    count: with several, a backend that reports its waits for the device inside
    ``compute_infer`` (Triton's Python backend does) would scale the device time by the waits
    the simulator adds itself. Windows with batch sizes outside the profile are skipped.

    Raises:
        ProfileError: No window carries statistics the profile covers.
    """
    usable = [
        s
        for s in samples
        if s.batch_sizes
        and s.infer_us > 0
        and min(s.batch_sizes) >= profile.min_batch_size
        and max(s.batch_sizes) <= profile.max_batch_size
    ]
    if not usable:
        raise ProfileError(
            f"{where}: no trial window carries server statistics within the profiled batch "
            f"sizes {profile.min_batch_size}-{profile.max_batch_size}"
        )
    fewest = min(s.instances for s in usable)
    base = [s for s in usable if s.instances == fewest]
    scales: dict[str, float] = {}
    for phase in ("input", "infer", "output"):
        observed = predicted = 0.0
        for s in base:
            items = sum(n * b for b, n in s.batch_sizes.items())
            observed += items * getattr(s, f"{phase}_us") / 1000.0
            predicted += sum(
                n * b * getattr(profile.timing(b), f"{phase}_ms") for b, n in s.batch_sizes.items()
            )
        scales[phase] = observed / predicted if predicted > 0 else 1.0

    def scale(timings: Iterable[BatchTiming]) -> tuple[BatchTiming, ...]:
        return tuple(
            replace(
                t,
                input_ms=t.input_ms * scales["input"],
                infer_ms=t.infer_ms * scales["infer"],
                output_ms=t.output_ms * scales["output"],
            )
            for t in timings
        )

    factors = ", ".join(f"{k} x{v:.3f}" for k, v in scales.items())
    return replace(
        profile,
        provenance=(
            f"{profile.provenance}; rescaled ({factors}) to {where}: {len(base)} windows with "
            f"{fewest} instance(s), per-request means over their batch mixes"
        ),
        # With size classes the expected table follows from the scaled classes (the
        # windows' batches were of the same mix the expectation is taken over).
        timings=scale(profile.timings),
        classes=tuple(replace(c, timings=scale(c.timings)) for c in profile.classes),
    )


def _mean_total(group: Sequence[WindowSample]) -> float:
    weights = [sum(n * b for b, n in s.batch_sizes.items()) for s in group]
    total = sum(weights)
    if not total:
        return 0.0
    return (
        sum(
            w * (s.input_us + s.infer_us + s.output_us) for s, w in zip(group, weights, strict=True)
        )
        / total
        / 1000.0
    )


def _mean_total_predicted(
    group: Sequence[WindowSample], fits: Mapping[str, tuple[float, float]]
) -> float:
    weights = [sum(n * b for b, n in s.batch_sizes.items()) for s in group]
    total = sum(weights)
    if not total:
        return 0.0
    a = sum(v[0] for v in fits.values())
    c = sum(v[1] for v in fits.values())
    return (
        sum(
            w * (a + c * _request_weighted_x(s.batch_sizes))
            for s, w in zip(group, weights, strict=True)
        )
        / total
    )


def run_dir_samples(run_dir: Path) -> list[WindowSample]:
    """Every measured window of every trial record (baseline, trials) in ``run_dir``.

    A record :func:`analyzer.rundir.records.load_trial` refuses (half-written, foreign, a version this
    perfsweep cannot read) is left out: the others still count.
    """
    return _read_samples(Path(run_dir))[0]


def _read_samples(run_dir: Path) -> tuple[list[WindowSample], list[str]]:
    """The window samples of ``run_dir``'s trial records, and why each refused record was."""
    samples: list[WindowSample] = []
    refused: list[str] = []
    for path in RunDirectory(run_dir).trial_paths():
        try:
            record = records.load_trial(path)
        except ResultFormatError as exc:
            refused.append(str(exc))
            continue
        instances = record.config.instance_count or 1
        for level in _levels(record.measurement):
            for window in level.windows:
                server = window.server
                if server is None:
                    continue
                sizes = {b: n for b, n in server.batch_sizes.items() if n > 0}
                if not sizes:
                    continue
                samples.append(
                    WindowSample(
                        instances,
                        sizes,
                        server.compute_input_us,
                        server.compute_infer_us,
                        server.compute_output_us,
                    )
                )
    return samples, refused


def _levels(measurement: TrialMeasurement | None) -> list[Measurement]:
    """Every load level a trial measured: the capacity search's points (throughput, pareto) and
    the fixed level (latency's level, pareto's reference level)."""
    if measurement is None:
        return []
    levels = list(measurement.capacity.points) if measurement.capacity is not None else []
    if measurement.fixed is not None:
        levels.append(measurement.fixed)
    return levels


def from_run_dir(run_dir: Path, model: str | None = None) -> Profile:
    """Fit a profile from the server statistics recorded in ``run_dir``'s trial windows.

    Raises:
        ProfileError: No window carries batch statistics (the message names the first trial
            record refused, when one was).
    """
    run_dir = Path(run_dir)
    if model is None:
        model = _run_model(run_dir)
    samples, refused = _read_samples(run_dir)
    where = f"run directory {run_dir.name}"
    if not samples and refused:
        raise ProfileError(
            f"{where}: none of its {len(refused)} trial record(s) could be read, the first: "
            f"{refused[0]}. Or give --profile FILE"
        )
    return fit_windows(samples, model, where)


def operating_points(
    trials: Iterable[TrialRecord],
) -> list[tuple[Knobs, float, float]]:
    """(config, offered rate, p99) of every trial whose operating point is an open-loop level
    that met the goals: where a profile's latency offset is calibrated
    (:func:`analyzer.predict.simulator.latency_offset`)."""
    points = []
    for r in trials:
        m = r.operating_point() if r.complete and r.meets_goals else None
        if m is not None and m.mode is LoadMode.REQUEST_RATE and m.target > 0:
            points.append((r.config, m.target, m.p99_ms))
    return points


def run_operating_points(run_dir: Path) -> list[tuple[Knobs, float, float]]:
    """:func:`operating_points` of ``run_dir``'s readable trial records, the baseline's too."""
    trials = []
    for path in RunDirectory(run_dir).trial_paths():
        try:
            trials.append(records.load_trial(path))
        except ResultFormatError:
            continue
    return operating_points(trials)


def _run_model(run_dir: Path) -> str:
    """The model the run tuned: summary.json's, else scenario.toml's (a run without a summary)."""
    layout = RunDirectory(run_dir)
    if layout.summary_json.is_file():
        try:
            return records.load_summary(layout.summary_json).model
        except ResultFormatError:
            pass
    scenario = layout.scenario_toml
    if scenario.is_file():
        import tomllib

        try:
            data = tomllib.loads(scenario.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            return ""
        section = data.get("model")
        if isinstance(section, dict):
            return str(section.get("name", ""))
        return str(section or "")
    return ""
