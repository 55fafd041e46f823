"""The scenario's ``[traffic]`` section: how load is offered (open or closed loop, the arrival
process or a trace, request classes with their priorities and goals, sequences).

A section like those of :mod:`analyzer.config.sections`, in a module of its own for its size.
"""

from __future__ import annotations

import enum
import functools
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from analyzer.config.sections import PositiveFloat, Section, pinned_digest
from analyzer.config.traces import read_trace
from analyzer.errors import InputError
from analyzer.measure.arrivals import Arrival, ArrivalProcess, Trace, parse_arrival
from analyzer.measure.lengths import Lengths, parse_dataset, parse_length
from analyzer.measure.specs import LoadMode


@functools.lru_cache(maxsize=4)
def _read_trace(path: Path, unit: str, sha256: str | None) -> Trace:
    """A trace file read once per content (``sha256``) rather than once per load level."""
    return read_trace(path, unit)


class TrafficClass(Section):
    """One class of a priority mix (``[[traffic.classes]]``): a share of the offered load sent
    with its own ``priority`` and ``timeout`` request parameters, as tritonclient sends them."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    """What the class is called in results and the report (letters, digits, ``_.-``)."""
    share: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Fraction of the offered load (of the requests sent) in this class; the shares of all
    classes sum to 1 (with classes at rates of their own: of the rest of the load)."""
    rate_rps: Annotated[float, Field(ge=0)] = 0.0
    """A rate of its own, requests/second, whatever the level's rate (instead of a share): a
    model that holds its traffic while the others' is scaled. A level's rate is the whole
    load's; the classes with shares divide what the fixed rates leave of it. Open loop only."""
    priority: Annotated[int, Field(ge=0)] = 0
    """Priority level sent with each request (1 = highest); 0 sends none: the model's
    ``default_priority_level``."""
    timeout_us: Annotated[int, Field(ge=0)] = 0
    """Queue timeout sent with each request (the ``timeout`` parameter), microseconds; 0 sends
    none: the model's queue policy decides."""
    p99_ms: Annotated[float, Field(ge=0)] = 0.0
    """This class's 99th-percentile latency goal, milliseconds; 0 = the run's ``goals.p99_ms``.
    At most ``goals.p99_ms``, the loosest goal (the rest of the traffic): a capacity step's
    sequential test and its fail-fast rule judge the overall p99 against it."""
    model: Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]+)?$")] = ""
    """The model this class's requests go to (built from that model's own inputs); empty: the
    run's model (``model.name``). Classes of several models are a mix of models served together
    by one server, each judged on its own goal."""

    @model_validator(mode="after")
    def _share_or_rate(self) -> TrafficClass:
        if (self.share > 0) == (self.rate_rps > 0):
            raise ValueError(
                f"traffic class {self.name!r}: give it a share of the load or a rate of its "
                f"own (rate_rps), one of them (got share {self.share:g}, rate_rps "
                f"{self.rate_rps:g})"
            )
        return self

    @model_serializer(mode="wrap")
    def _leave_out_no_model(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A class of the run's model, or without a rate of its own, dumps as before classes
        # could name a model or hold a rate (records, TOML and hashes of older scenarios stay
        # as they were).
        data: dict[str, Any] = handler(self)
        if not self.model:
            data.pop("model", None)
        if not self.rate_rps:
            data.pop("rate_rps", None)
        return data


#: Shares of the traffic classes must sum to 1 within this.
SHARE_TOLERANCE = 1e-6
#: ``[traffic]`` sequence settings and their defaults (left out of a dump at these values).
_SEQUENCE_DEFAULTS = (
    ("sequence_length", 20),
    ("sequence_length_variation_pct", 20.0),
    ("sequences", 4),
)


#: The ``[traffic]`` keys that describe the arrival process.
ARRIVAL_KEYS = ("arrival", "trace", "trace_unit", "trace_sha256")
#: ``[traffic]`` trace settings and their defaults (left out of a dump at these values).
_TRACE_DEFAULTS = (("trace", None), ("trace_unit", "auto"), ("trace_sha256", None))


class TrafficMode(str, enum.Enum):
    """``[traffic] mode``: how the scenario offers load (:attr:`load_mode`, the generator's word)."""

    RATE = "rate"
    CONCURRENCY = "concurrency"

    @property
    def load_mode(self) -> LoadMode:
        """The generator's mode for this traffic mode."""
        return LoadMode.REQUEST_RATE if self is TrafficMode.RATE else LoadMode.CONCURRENCY


class TrafficSection(Section):
    """How load is offered."""

    mode: TrafficMode = TrafficMode.RATE
    """``rate``: open loop (requests are sent on a schedule, latency counted from the intended send
    time); ``concurrency``: closed loop (N users, each waits for its response)."""
    arrival: str | tuple[str, ...] = "poisson"
    """The open-loop arrival process, in its short form: ``poisson``, ``constant``,
    ``gamma:cv=2``, ``mmpp:4@0.5,0.25@2`` (relative rate @ mean sojourn seconds, states in
    turn), ``ramp:start=0.5,end=1.5,period_s=60``, ``diurnal:amplitude=0.5,period_s=60``, or
    ``trace`` (with ``trace``). Every level offers its rate in this shape. A list of shapes
    (``["poisson", "trace"]``): a sweep measures each config's capacity under every one and
    ranks configs by the worst of them (objective ``throughput`` only)."""
    trace: Path | None = None
    """A recorded trace to replay (``.csv`` or ``.jsonl`` timestamps, else perf_analyzer's
    ``--request-intervals``), scaled to each level's rate and looped; relative to the scenario
    file. Sets ``arrival`` to ``trace``."""
    trace_unit: Literal["auto", "s", "ms", "us"] = "auto"
    """The trace's time unit (``auto``: a CSV/JSONL column's ``_ms``/``_us`` suffix, else
    seconds; microseconds for an intervals file)."""
    trace_sha256: str | None = None
    """SHA-256 of ``trace``, filled in when the scenario is loaded; a recorded scenario whose
    trace has changed since is refused."""
    rate_rps: PositiveFloat | None = None
    """Fixed offered load (requests/s) for the ``latency`` objective."""
    concurrency: Annotated[int, Field(ge=1)] | None = None
    """Fixed number of users for the ``latency`` objective in closed-loop mode."""
    min_rate_rps: PositiveFloat = 1.0
    """Lowest offered rate the capacity search tries (it descends there when the start fails)."""
    start_rps: PositiveFloat | None = None
    """First rate of a capacity search before any capacity is known (default: 10x min_rate_rps,
    within the bounds); later searches start near half the best capacity found so far."""
    max_rate_rps: PositiveFloat = 2000.0
    """Highest offered rate the capacity search tries (the client's own ceiling on this host)."""
    max_concurrency: Annotated[int, Field(ge=1)] = 256
    """Highest concurrency the closed-loop capacity search tries."""
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """Locust generator processes on this host (1 = in the sweep's own process). ``"auto"``
    starts with one and adds processes, up to one per core, whenever the generator's self-check
    finds the generator saturated (the level is then measured again with more)."""
    expect_workers: Annotated[int, Field(ge=0)] = 0
    """Remote Locust workers (``perfsweep load --worker --master-host H``) the sweep waits for
    as their master, instead of generating load itself (0 = none)."""
    master_bind_host: str = "127.0.0.1"
    """With ``expect_workers``: the address the Locust master listens on for its workers."""
    master_port: Annotated[int, Field(ge=0, le=65535)] = 5557
    """With ``expect_workers``: the Locust master's port (0 = a free port)."""
    input_tokens: str | None = None
    """A generative model's prompt lengths, tokens: ``N`` or a distribution
    (``uniform:LO,HI``, ``lognormal:mean=M,sd=S``); default 128 (``--input-tokens``)."""
    output_tokens: str | None = None
    """A generative model's output lengths (as ``input_tokens``); default 64
    (``--output-tokens``)."""
    dataset: Path | None = None
    """A generative model's requests from a JSONL file, one a line: a prompt or
    ``input_tokens``, and ``output_tokens`` (``--dataset``; instead of the lengths)."""
    classes: tuple[TrafficClass, ...] = ()
    """A priority mix: each request is drawn into one class by its ``share`` and sent with the
    class's priority and timeout; results and goals are per class. Empty: one implicit class
    (no priority or timeout sent), judged on the run's goals."""
    sequence_length: Annotated[int, Field(ge=1)] = 20
    """A sequence-batched (stateful) model: mean requests per sequence (perf_analyzer's
    ``--sequence-length``). Other models ignore the three ``sequence*`` settings."""
    sequence_length_variation_pct: Annotated[float, Field(ge=0)] = 20.0
    """A sequence model: each sequence's length is drawn uniformly within this many percent of
    ``sequence_length`` (perf_analyzer's ``--sequence-length-variation``)."""
    sequences: Annotated[int, Field(ge=1)] = 4
    """A sequence model in open loop: live sequences per generator process, each with at most
    one request in flight; a send finds none idle waits, and its wait counts as queueing
    (perf_analyzer's ``--num-of-sequences``). Closed loop: one sequence per user."""

    @model_validator(mode="after")
    def _check_arrival(self) -> TrafficSection:
        shapes = self.shapes
        if len(shapes) == 1 and not isinstance(self.arrival, str):
            object.__setattr__(self, "arrival", shapes[0])  # frozen: a list of one is its shape
        elif len(set(shapes)) < len(shapes) or not shapes:
            raise ValueError(f"traffic.arrival: each shape once, got {list(shapes)}")
        if self.mode is not TrafficMode.RATE and len(shapes) > 1:
            raise ValueError("traffic.arrival: several shapes need traffic.mode = 'rate'")
        for shape in shapes:
            if shape.partition(":")[0].strip() == Arrival.TRACE.value:
                continue
            try:
                parse_arrival(shape)
            except InputError as exc:
                raise ValueError(f"traffic.arrival: {exc}") from None
        replays = Arrival.TRACE.value in shapes
        if self.trace is None:
            if self.trace_sha256 is not None:
                raise ValueError("traffic.trace_sha256 needs traffic.trace")
            if replays:
                raise ValueError("traffic.arrival = 'trace' replays a file: set traffic.trace")
            return self
        if shapes == ("poisson",):
            object.__setattr__(self, "arrival", "trace")  # a trace alone: its shape is the trace
        elif not replays:
            raise ValueError(
                f"traffic.trace replays a recording; it cannot be shaped as {self.arrival!r} "
                "too (leave traffic.arrival out, or list 'trace' among its shapes)"
            )
        path = self.trace.expanduser().resolve()
        object.__setattr__(self, "trace", path)  # frozen: made absolute once, here
        if not path.is_file():
            raise ValueError(f"traffic.trace {path}: no such file")
        digest = pinned_digest("traffic.trace", path, self.trace_sha256)
        object.__setattr__(self, "trace_sha256", digest)  # frozen: filled in once, here
        try:
            self.arrival_processes()
        except InputError as exc:
            raise ValueError(f"traffic.trace: {exc}") from None
        return self

    @model_validator(mode="after")
    def _check_lengths(self) -> TrafficSection:
        if self.dataset is not None:
            if self.input_tokens is not None or self.output_tokens is not None:
                raise ValueError(
                    "traffic.dataset gives each request's lengths; leave out "
                    "traffic.input_tokens/output_tokens"
                )
            path = self.dataset.expanduser().resolve()
            object.__setattr__(self, "dataset", path)  # frozen: made absolute once, here
            if not path.is_file():
                raise ValueError(f"traffic.dataset {path}: no such file")
        try:
            self.lengths()
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return self

    def lengths(self) -> Lengths:
        """A generative model's request lengths (``input_tokens``/``output_tokens``, or the
        ``dataset``'s lines)."""
        if self.dataset is not None:
            text = self.dataset.read_text(encoding="utf-8")
            return Lengths(dataset=parse_dataset(text, str(self.dataset)), source=self.dataset.name)
        return Lengths(
            parse_length(self.input_tokens or "128", "traffic.input_tokens"),
            parse_length(self.output_tokens or "64", "traffic.output_tokens"),
        )

    @property
    def shapes(self) -> tuple[str, ...]:
        """The arrival shapes, in their short form (one unless ``arrival`` lists several)."""
        return (self.arrival,) if isinstance(self.arrival, str) else tuple(self.arrival)

    def arrival_processes(self) -> tuple[ArrivalProcess, ...]:
        """Every shape's arrival process, in :attr:`shapes` order (a trace read from its file)."""
        return tuple(self._process(shape) for shape in self.shapes)

    def arrival_process(self) -> ArrivalProcess:
        """The one arrival process the levels are offered in.

        Raises:
            InputError: ``arrival`` lists several shapes: only a sweep measures each of them.
        """
        if len(self.shapes) > 1:
            raise InputError(
                f"traffic.arrival lists {len(self.shapes)} shapes ({', '.join(self.shapes)}); "
                "only perfsweep run measures each: give one (--arrival) here"
            )
        return self._process(self.shapes[0])

    def _process(self, shape: str) -> ArrivalProcess:
        if shape != Arrival.TRACE.value:
            return parse_arrival(shape)
        assert self.trace is not None  # the validator refuses 'trace' without a file
        return parse_arrival("trace", _read_trace(self.trace, self.trace_unit, self.trace_sha256))

    @model_validator(mode="after")
    def _check_classes(self) -> TrafficSection:
        names = [c.name for c in self.classes]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"traffic.classes: class name {repeated[0]!r} is used twice")
        scaled = [c for c in self.classes if c.share > 0]
        total = sum(c.share for c in scaled)
        if self.classes and not scaled:
            raise ValueError(
                "traffic.classes: every class has a rate of its own; give at least one a share "
                "(the load a capacity search scales)"
            )
        if scaled and abs(total - 1.0) > SHARE_TOLERANCE:
            shares = " + ".join(f"{c.share:g}" for c in scaled)
            raise ValueError(f"traffic.classes: the shares must sum to 1, got {shares} = {total:g}")
        if fixed := self.fixed_rps():
            if self.mode is not TrafficMode.RATE:
                raise ValueError(
                    "traffic.classes: a class with a rate of its own (rate_rps) needs open-loop "
                    "load (traffic.mode = rate)"
                )
            if self.min_rate_rps <= fixed:
                raise ValueError(
                    f"traffic.min_rate_rps ({self.min_rate_rps:g}) must be above the classes' "
                    f"own rates ({fixed:g} req/s in all): a level's rate is the whole load's, "
                    "and the classes with shares divide what is left of it"
                )
        return self

    def fixed_rps(self) -> float:
        """The classes' own rates summed (0: every class has a share)."""
        return sum(c.rate_rps for c in self.classes)

    @model_serializer(mode="wrap")
    def _leave_out_no_classes(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # No mix: the section dumps as before classes existed (records, TOML and hashes of
        # older scenarios stay as they were).
        data: dict[str, Any] = handler(self)
        if not self.classes:
            data.pop("classes", None)
        # The sequence settings at their defaults dump as before they existed, for the same
        # reason: records, TOML and the hash of older scenarios stay as they were.
        for key, default in (*_SEQUENCE_DEFAULTS, *_TRACE_DEFAULTS):
            if data.get(key) == default:
                data.pop(key, None)
        return data

    def class_goals(self) -> tuple[tuple[str, float], ...]:
        """``(name, p99_ms)`` of every class with its own p99 goal (the others take the run's
        ``goals.p99_ms``): what :class:`analyzer.measure.specs.Goals` ``classes`` is built from."""
        return tuple((c.name, c.p99_ms) for c in self.classes if c.p99_ms > 0)
