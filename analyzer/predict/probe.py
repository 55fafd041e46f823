"""The profile phase: ask a live server for batches of chosen sizes and read their times.

Traffic does not have to produce the batch sizes the simulator needs: for each size ``b`` the
model is loaded with ``max_batch_size: b``, ``preferred_batch_size: [b]`` and a long
``max_queue_delay_microseconds`` (:data:`PROBE_DELAY_US`), so the batcher holds requests until
exactly ``b`` items are queued, and a burst of ``b`` concurrent batch-1 requests becomes one
execution of ``b``. (``max_batch_size: b`` matters: with a delay, a batch that reached its
preferred size is not sealed and keeps growing while it waits for an instance, as in Triton.)
The server's own statistics (``GET /v2/models/<m>/stats``, ``batch_stats``) give
``compute_input``, ``compute_infer`` and ``compute_output`` of that execution: the difference
of two reads around each burst. Sizes are geometric (1, 2, 4, ... and ``max_batch_size``), so
the simulator interpolates between them and never extrapolates beyond the largest.

The requests are the load's own: the scenario's request data (``[input]``: a perf_analyzer
data file, ``--shape``, a shape ``distribution``, the batch size, BYTES inputs) built by the
load's machinery (:func:`analyzer.load.inputs.build_inputs`) and sent as the load sends them.
With a batch size ``k`` per request, the batch sizes are multiples of ``k`` (bursts of ``b / k``
requests). Where the requests differ in size (:func:`analyzer.load.payloads.request_sizes`: the
elements of their variable-dim inputs, else the bytes of their longest BYTES element), each
batch size is timed at a few request sizes of the data (:attr:`ProbePlan.size_classes`: size
quantiles, the smallest and largest included), every request of a burst of one size, so the
batch is padded to it; the profile carries one :class:`~analyzer.predict.profile.SizeClass`
per size and the data's :class:`~analyzer.predict.profile.RequestMix`, which the simulator
draws from. Data the profile cannot represent is refused with a :class:`ProfileError` that
says why (the data cannot be built for the model, or its inputs do not grow together), so a
sweep falls back to another search before any trial.

Instance interference: the same is done with ``N`` instances and bursts of ``N * b``
items (``N`` batches of ``b`` at once, requests of the median size class); the mean execution
time there over the one at 1 instance is ``Profile.interference[N]``. It says how much of an
execution the device serialises (:class:`~analyzer.predict.interference.Overlap`): where that is
less than ``compute_infer`` (a backend that reports its host work inside it, as Triton's Python
backend does), the difference is ``Profile.overlap_ms``, which the simulator runs as host work;
the serialised share itself is ``Profile.serial_share``, and the batch size it was measured at
``Profile.overlap_batch`` (with several request sizes the host work is taken per request).
Jitter is the mean relative standard deviation of one execution's time over a size's bursts
(each burst at 1 instance is one execution).

Bounded: at most ``max_requests`` inferences and ``time_budget_s`` seconds; a probe cut short
returns the batch sizes it finished at every size class (the largest finished size bounds what
the profile covers) and says so in the provenance. It leaves the model on its last probe
config: the caller loads the next one.

Requests are plain HTTP/1.1 (the binary tensor extension: numeric tensors as their bytes, BYTES
elements as a 4-byte little-endian length and their bytes) from a thread pool, through the
transport seam (:class:`analyzer.target.transport.KeepAliveTransport`: one keep-alive connection per
pool thread), so nothing here needs gevent or tritonclient's HTTP client.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.errors import InputError, TargetError
from analyzer.load.inputs import InputOptions, InputSet, build_inputs
from analyzer.load.payloads import binary_request, request_sizes
from analyzer.predict import ProfileError
from analyzer.predict.interference import Overlap, overlap_from_interference
from analyzer.predict.probe_plan import (
    PROBE_DELAY_US,
    ProbePlan,
    geometric_sizes,
    model_metadata,
    probe_config,
)
from analyzer.predict.profile import BatchTiming, Profile, RequestMix, SizeClass
from analyzer.target.protocol import Target, untunable_reason
from analyzer.target.server_stats import http_stats_source
from analyzer.target.transport import KeepAliveTransport, Request, Transport, UrllibTransport

#: Bursts of the interference probe (and of the one-instance size it is compared with), in
#: multiples of ``ProbePlan.bursts``: the overlap is a small difference of two means.
INTERFERENCE_BURSTS = 4
REFERENCE_BURSTS = 2

#: How long the statistics may lag behind the answers of a burst before the probe reads on.
STATS_SETTLE_S = 5.0

#: Distinct payloads a size class's bursts cycle through (the first ones of that size).
PAYLOADS_PER_CLASS = 64


@dataclass(frozen=True)
class _Requests:
    """What the probe sends: the load's payloads, their mix, and per size class the bodies of
    requests of that size (one batching key)."""

    inputs: InputSet
    mix: RequestMix
    #: Per size class (ascending): its size and the payload indices of its requests.
    classes: tuple[tuple[int, tuple[int, ...]], ...]


def _requests(config: mc.ModelConfig, options: InputOptions, plan: ProbePlan) -> _Requests:
    """Build the load's request data for ``config`` and choose the size classes to time.

    Raises:
        ProfileError: The data cannot be built for this model, or its sizes cannot be told.
    """
    metadata = model_metadata(config)
    document = json_format.MessageToDict(config, preserving_proto_field_name=True)
    try:
        inputs = build_inputs(metadata, document, options=options)
        sizes = request_sizes(inputs, metadata, document)
    except InputError as exc:
        raise ProfileError(f"the probe cannot send the load's request data: {exc}") from exc
    if not inputs.payloads:
        raise ProfileError("the probe cannot send the load's request data: it has no requests")
    mix = RequestMix.of(sizes.measure, sizes.sizes, sizes.keys, sizes.items)
    distinct = mix.sizes
    if len(distinct) <= 1:
        points = list(distinct)
    else:
        count = max(2, plan.size_classes)
        points = sorted({mix.quantile(i / (count - 1)) for i in range(count)})
        points = sorted({distinct[0], distinct[-1], *points})
    classes = []
    for size in points:
        members = [i for i, s in enumerate(sizes.sizes) if s == size]
        # One batching key per class (its most common), so a burst forms one batch.
        keys = Counter(sizes.keys[i] for i in members)
        common = keys.most_common(1)[0][0]  # ties: the first seen
        chosen = [i for i in members if sizes.keys[i] == common]
        classes.append((size, tuple(chosen[:PAYLOADS_PER_CLASS])))
    return _Requests(inputs, mix, tuple(classes))


class _Sender:
    """Inferences through ``transport`` (default: a :class:`KeepAliveTransport`, one
    connection per pool thread); each sends one prepared request body (the load's payloads)."""

    def __init__(
        self,
        url: str,
        model: str,
        bodies: Mapping[int, tuple[bytes, int]],
        timeout_s: float,
        transport: Transport | None = None,
        access: ServerAccess = PLAIN,
    ) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.url = f"{parts.scheme or 'http'}://{self.host}:{self.port}/v2/models/{model}/infer"
        self.timeout_s = timeout_s
        self._owned: KeepAliveTransport | None = None
        if transport is None:
            transport = self._owned = KeepAliveTransport(access=access)
        self.transport = transport
        self.requests: dict[int, Request] = {}
        for index, (body, header_length) in bodies.items():
            self.requests[index] = Request(
                "POST",
                self.url,
                timeout_s=timeout_s,
                content=body,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Inference-Header-Content-Length": str(header_length),
                },
            )

    def infer(self, index: int) -> None:
        try:
            reply = self.transport.request(self.requests[index])
        except OSError as exc:
            raise TargetError(f"probe inference to {self.host}:{self.port} failed: {exc}") from exc
        if reply.status != 200:
            raise TargetError(
                f"probe inference refused ({reply.status}): "
                f"{reply.content[:200].decode(errors='replace')}"
            )

    def close(self) -> None:
        """Close the connections of the transport it made (a given one is its caller's)."""
        if self._owned is not None:
            self._owned.close()


def _batch_totals(doc: Mapping[str, Any], model: str) -> dict[int, tuple[int, int, int, int]]:
    """Batch size -> (executions, input ns, infer ns, output ns) summed over the versions."""
    totals: dict[int, list[int]] = {}
    for entry in doc.get("model_stats", []):
        if entry.get("name") != model:
            continue
        for b in entry.get("batch_stats", []):
            size = int(b.get("batch_size", 0))
            acc = totals.setdefault(size, [0, 0, 0, 0])
            acc[0] += int(b.get("compute_infer", {}).get("count", 0))
            for i, key in enumerate(("compute_input", "compute_infer", "compute_output"), 1):
                acc[i] += int(b.get(key, {}).get("ns", 0))
    return {k: (v[0], v[1], v[2], v[3]) for k, v in totals.items()}


@dataclass
class _Phases:
    """Executions of one size and the sum of each phase (ns), plus each burst's total."""

    executions: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    per_burst_ms: tuple[float, ...] = ()

    def mean_total_ms(self) -> float:
        total = self.input_ns + self.infer_ns + self.output_ns
        return total / self.executions / 1e6 if self.executions else 0.0


def probe(
    target: Target,
    plan: ProbePlan | None = None,
    *,
    inputs: InputOptions | None = None,
    stats: Callable[[], Mapping[str, Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    transport: Transport | None = None,
) -> Profile:
    """Measure execution time per batch size (per request size of the load's data, and
    instance interference) on ``target``.

    Args:
        target: A started target; its model's current config is the base of every probe
            config (inputs, backend, instance kind).
        plan: What to measure (default :class:`ProbePlan`).
        inputs: The load's request data (a scenario's ``[input]``, as
            :func:`analyzer.load.engine.input_options` makes it); None: seeded random data of
            the model's own shapes, batch size 1.
        stats: Reads the statistics document (default: ``GET /v2/models/<m>/stats``).
        clock: Monotonic seconds (the time budget).
        sleep: Waits between statistics reads while they catch up with a burst.
        transport: The HTTP seam of the inferences and the default statistics reads (default:
            a :class:`~analyzer.target.transport.KeepAliveTransport` for the inferences, closed at
            the end, and urllib for the statistics).

    Raises:
        ProfileError: the model cannot be probed (no batching, an ensemble or sequence-batched
            model), the load's request data cannot be sent or sized (it says why), or not even
            the smallest batch could be measured in the budget.
        TargetError: the server failed a request or refused a probe config.
    """
    plan = plan or ProbePlan()
    base = target.model_config()
    model = target.model
    mbs = base.max_batch_size
    why = untunable_reason(base)
    if why is not None:
        raise ProfileError(f"cannot probe: {why}")
    if base.HasField("sequence_batching"):
        # Its probe bursts would carry no sequence ids: the server refuses every request.
        raise ProfileError(
            f"cannot probe: model {model!r} is sequence-batched (a stateful model), whose "
            "requests need sequence ids; the simulator does not model the sequence batcher"
        )
    if mbs < 1:
        raise ProfileError(
            f"model {model!r} has max_batch_size 0 (no batching): there are no batch sizes to "
            "probe; a profile of batch 1 comes from any run's statistics"
        )
    data = _requests(base, inputs or InputOptions(), plan)
    items = data.mix.items
    sizes = plan.batch_sizes or geometric_sizes(mbs, items)
    if min(sizes) < 1 or max(sizes) > mbs:
        raise ProfileError(f"probe sizes must lie in 1..{mbs} (max_batch_size), got {sizes}")
    if any(b % items for b in sizes):
        raise ProfileError(
            f"probe sizes must be multiples of the {items} items per request, got {sizes}"
        )
    sizes = tuple(sorted(set(sizes)))
    read_stats = stats or http_stats_source(
        target.url, model, transport=transport or UrllibTransport(target.access)
    )
    deadline = clock() + plan.time_budget_s
    sent = 0
    cut: list[str] = []
    width = max(sizes) // items * max(1, plan.instances)
    used = {i for _, members in data.classes for i in members}
    sender = _Sender(
        target.url,
        model,
        {i: binary_request(data.inputs, i) for i in sorted(used)},
        plan.request_timeout_s,
        transport,
        target.access,
    )
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="probe")
    multi = len(data.classes) > 1

    def burst(members: Sequence[int], n: int) -> None:
        """``n`` concurrent requests, cycling through ``members``' payloads."""
        nonlocal sent
        futures = [pool.submit(sender.infer, members[(sent + i) % len(members)]) for i in range(n)]
        sent += n
        for f in futures:
            f.result()

    expected_items = 0  # items the statistics must show once every sent request is counted

    def settled() -> dict[int, tuple[int, int, int, int]]:
        """The batch totals once they count every request sent (Triton updates its statistics
        after it has answered, so a read right after a burst can miss its execution)."""
        give_up = clock() + STATS_SETTLE_S
        while True:
            totals = _batch_totals(read_stats(), model)
            if _items(totals) >= expected_items or clock() > give_up:
                return totals
            sleep(0.002)

    def affordable(per_burst: int, bursts_needed: int) -> bool:
        return sent + per_burst * bursts_needed <= plan.max_requests and clock() <= deadline

    def load(size: int, instances: int) -> bool:
        """Load the probe config (False: out of budget for a warm-up and one burst of every
        size class)."""
        nonlocal expected_items
        per_burst = size // items * instances
        if not affordable(per_burst, (plan.warmup_bursts + 1) * len(data.classes)):
            cut.append(f"batch {size} at {instances} instance(s)")
            return False
        target.load_config(probe_config(base, size, instances))
        expected_items = _items(_batch_totals(read_stats(), model))
        return True

    def warm(members: Sequence[int], per_burst: int) -> bool:
        """Warm-up bursts (first executions, and the first of each request size, are slow on
        real backends); False when out of budget."""
        nonlocal expected_items
        if not affordable(per_burst, plan.warmup_bursts + 1):
            return False
        for _ in range(plan.warmup_bursts):
            burst(members, per_burst)
            expected_items += per_burst * items
        return True

    def bursts(
        members: Sequence[int], per_burst: int, count: int
    ) -> Iterator[dict[int, tuple[int, int, int, int]]]:
        """Send ``count`` measured bursts; yield each one's executions per batch size (stats
        deltas)."""
        nonlocal expected_items
        before = settled()
        for _ in range(count):
            if not affordable(per_burst, 1):
                return
            burst(members, per_burst)
            expected_items += per_burst * items
            after = settled()
            yield {
                b: delta
                for b, now in after.items()
                if (delta := _minus(now, before.get(b, (0, 0, 0, 0))))[0] > 0
            }
            before = after

    def measure(size: int, members: Sequence[int], count: int) -> _Phases | None:
        """``count`` bursts of ``size`` items of one size class at one instance (the probe
        config loaded): each one execution of exactly ``size``."""
        per_burst = size // items
        if not warm(members, per_burst):
            return None
        phases = _Phases()
        totals: list[float] = []
        for delta in bursts(members, per_burst, count):
            if size not in delta:
                continue  # the burst did not form a batch of this size (a straggler)
            n, i, f, o = delta[size]
            phases.executions += n
            phases.input_ns += i
            phases.infer_ns += f
            phases.output_ns += o
            totals.append((i + f + o) / n / 1e6)
        phases.per_burst_ms = tuple(totals)
        return phases if phases.executions else None

    def interfere(
        size: int, instances: int, members: Sequence[int], alone: Profile
    ) -> list[float] | None:
        """Bursts of ``instances * size`` items at ``instances`` instances: per burst, the
        observed execution time over what the one-instance profile predicts for the same
        batches (each batch size that formed is compared with its own one-instance time)."""
        if not load(size, instances):
            return None
        per_burst = size // items * instances
        if not warm(members, per_burst):
            return None
        ratios: list[float] = []
        for delta in bursts(members, per_burst, INTERFERENCE_BURSTS * plan.bursts):
            observed = predicted = 0.0
            for b, (n, i, f, o) in delta.items():
                if alone.min_batch_size <= b <= alone.max_batch_size:
                    observed += (i + f + o) / 1e6
                    predicted += n * alone.timing(b).total_ms
            if predicted > 0:
                ratios.append(observed / predicted)
        return ratios or None

    # Per size class (the data's classes, ascending), per batch size: the measured phases.
    measured: list[dict[int, _Phases]] = [{} for _ in data.classes]
    interference: dict[int, float] = {}
    overlap: Overlap | None = None
    # The interference probe runs requests of the class nearest the data's median size.
    median = data.mix.quantile(0.5)
    typical = min(range(len(data.classes)), key=lambda c: abs(data.classes[c][0] - median))
    try:
        # The interference ratio divides by the one-instance time of its batch size: that size
        # gets more bursts, as the interference probe does (both means are of one execution
        # time, and a share of the difference is what the overlap rests on).
        planned_ref = _reference_size(plan, sizes)
        for size in sizes:
            if not load(size, 1):
                break  # larger sizes would be cut too; the profile covers what it has
            extra = plan.instances > 1 and size == planned_ref
            row: list[_Phases] = []
            for c, (_, members) in enumerate(data.classes):
                count = REFERENCE_BURSTS * plan.bursts if extra and c == typical else plan.bursts
                phases = measure(size, members, count)
                if phases is None:
                    break
                row.append(phases)
            if len(row) < len(data.classes):
                cut.append(f"batch {size} at every request size")
                break  # a batch size is covered at every size class or not at all
            for c, phases in enumerate(row):
                measured[c][size] = phases
        n = plan.instances
        if n > 1 and min(sizes) in measured[typical]:
            alone = _profile(model, "", measured[typical], 0.0, {})
            ref = _reference_size(plan, sorted(measured[typical]))
            ratios = interfere(ref, n, data.classes[typical][1], alone)
            if ratios is not None:
                overlap = overlap_from_interference(alone.timing(ref), n, ratios)
                interference[n] = overlap.ratio
    finally:
        pool.shutdown(wait=True)
        sender.close()
    smallest = min(sizes)
    if smallest not in measured[0]:
        raise ProfileError(
            f"the probe of {model!r} measured no execution of batch size {smallest} within "
            f"{plan.max_requests} requests and {plan.time_budget_s:g} s; raise the budget"
        )
    spreads = [
        statistics.stdev(p.per_burst_ms) / statistics.fmean(p.per_burst_ms)
        for per_size in measured
        for p in per_size.values()
        if len(p.per_burst_ms) >= 3 and statistics.fmean(p.per_burst_ms) > 0
    ]
    jitter = statistics.fmean(spreads) if spreads else 0.0
    facts = target.describe()
    name = " ".join(str(facts[k]) for k in ("server", "server_version") if facts.get(k))
    where = f"{name or facts.get('kind', 'server')} at {target.url}"
    note = f"; cut short by the budget before {', '.join(cut)}" if cut else ""
    executions = sum(p.executions for per_size in measured for p in per_size.values())
    timed = (
        f" at request sizes {', '.join(str(s) for s, _ in data.classes)} (every request of a "
        "burst of one size)"
        if multi
        else ""
    )
    profile = _profile(
        model,
        (
            f"probed: {where}, batch sizes {', '.join(map(str, sorted(measured[0])))} forced "
            f"with max_batch_size = preferred_batch_size = b, max_queue_delay {PROBE_DELAY_US} "
            f"us{timed}, {executions} executions at 1 instance from batch_stats deltas ({sent} "
            f"requests of the load's data: {data.inputs.source}; {data.mix.describe()}); "
            "jitter = spread of single executions"
            + (f"; interference: {overlap.describe()}" if overlap is not None else "")
            + note
        ),
        measured[0],
        jitter,
        interference,
        overlap.ms if overlap is not None else 0.0,
        overlap.serial_share if overlap is not None else None,
        overlap.batch_size if overlap is not None else None,
    )
    classes = tuple(
        SizeClass(size, _profile(model, "", per_size, 0.0, {}).timings)
        for (size, _), per_size in zip(data.classes, measured, strict=True)
    )
    return replace(
        profile,
        mix=data.mix,
        classes=classes if multi else (),
        timings=classes[0].timings,
    )


def _reference_size(plan: ProbePlan, sizes: Sequence[int]) -> int:
    """The batch size of the interference probe: the plan's, else the median of ``sizes``."""
    return plan.interference_batch or sizes[len(sizes) // 2]


def _items(totals: Mapping[int, tuple[int, int, int, int]]) -> int:
    """Requests (batch items) the totals count."""
    return sum(b * v[0] for b, v in totals.items())


def _minus(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])


def _profile(
    model: str,
    provenance: str,
    measured: Mapping[int, _Phases],
    jitter: float,
    interference: Mapping[int, float],
    overlap_ms: float = 0.0,
    serial_share: float | None = None,
    overlap_batch: int | None = None,
) -> Profile:
    """The profile of the sizes measured at one instance (means per execution)."""
    timings = tuple(
        BatchTiming(
            b,
            p.input_ns / p.executions / 1e6,
            p.infer_ns / p.executions / 1e6,
            p.output_ns / p.executions / 1e6,
            p.executions,
        )
        for b, p in sorted(measured.items())
    )
    return Profile(
        model=model,
        provenance=provenance,
        source="probe",
        timings=timings,
        jitter=jitter,
        instances_profiled=1,
        interference=dict(interference),
        overlap_ms=overlap_ms,
        serial_share=serial_share,
        overlap_batch=overlap_batch,
    )


__all__ = ["probe"]
