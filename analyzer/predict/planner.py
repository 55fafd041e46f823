"""The library call behind ``perfsweep predict``: which profile, which config, which question.

:func:`plan` resolves a :class:`PlanRequest` (a run directory, a profile file or a live
server to probe; a rate or a p99 goal; config overrides) into a :class:`PlanReport`;
:func:`render_text` prints it. Only with ``url`` is a server contacted: the profile phase
(:func:`analyzer.predict.probe.probe`) runs against it, and the model's config is loaded back
as it was found.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tomllib

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import JointKnobs
from analyzer.config.traffic import ARRIVAL_KEYS, TrafficSection
from analyzer.documents import PREDICTION_KIND, header
from analyzer.errors import InputError, ResultFormatError
from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.predict.capacity import capacity, latency_offset
from analyzer.predict.fitting import from_run_dir, run_operating_points
from analyzer.predict.profile import Profile, load_profile, save_profile
from analyzer.predict.sim_records import CapacityPrediction, Prediction, SimConfig
from analyzer.predict.simulator import ASSUMPTIONS, simulate
from analyzer.predict.sources import from_toml
from analyzer.rundir import records

if TYPE_CHECKING:
    from analyzer.load.inputs import InputOptions
    from analyzer.predict.probe_plan import ProbePlan

T = TypeVar("T")


@dataclass(frozen=True)
class PlanRequest:
    """One question to the simulator.

    Attributes:
        run_dir: A ``perfsweep run`` directory (profile from its trials, default config = its
            best, else its baseline); may be None with ``profile_path`` or ``url``.
        profile_path: A profile JSON (``Profile.to_dict``) or a simulated-device TOML; wins over
            the run directory's own statistics.
        url: A running server whose ``model`` is probed for the profile (and whose current
            config is the default config); its config is loaded back afterwards.
        model: The model to probe (with ``url``).
        probe: What the profile phase measures (with ``url``; None = its defaults).
        inputs: The request data the probe sends (with ``url``; None = seeded random data of
            the model's own shapes, batch size 1), as the load would send it.
        save_profile: Write the profile used (e.g. the probed one) to this JSON file.
        rate_rps: Predict latency and batch sizes at this rate (of ``arrival``).
        p99_ms: Or: predict the capacity at this p99 goal.
        max_batch_size / max_queue_delay_us / preferred_batch_size / instance_count: Config
            overrides (None = the default config's value).
        requests: Simulated arrivals per rate.
        seed: Simulation seed.
        arrival: The arrival process simulated (Poisson by default).
    """

    run_dir: Path | None = None
    profile_path: Path | None = None
    rate_rps: float | None = None
    p99_ms: float | None = None
    max_batch_size: int | None = None
    max_queue_delay_us: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    instance_count: int | None = None
    requests: int = 20000
    seed: int = 0
    url: str | None = None
    model: str | None = None
    #: TLS files and headers of the ``url`` server.
    access: ServerAccess = PLAIN
    probe: ProbePlan | None = None
    inputs: InputOptions | None = None
    save_profile: Path | None = None
    arrival: ArrivalProcess = POISSON


@dataclass(frozen=True)
class PlanReport:
    """The answer, with what it rests on."""

    profile: Profile
    config: SimConfig
    config_source: str
    prediction: Prediction | None
    capacity: CapacityPrediction | None
    assumptions: tuple[str, ...] = ASSUMPTIONS
    #: The arrival process simulated.
    arrival: ArrivalProcess = POISSON

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``perfsweep predict --json``)."""
        return {
            **header(PREDICTION_KIND),
            "config": {
                "max_batch_size": self.config.max_batch_size,
                "max_queue_delay_us": self.config.max_queue_delay_us,
                "preferred_batch_size": list(self.config.preferred_batch_size),
                "instance_count": self.config.instance_count,
                "dynamic_batching": self.config.dynamic_batching,
            },
            "config_source": self.config_source,
            "arrival": self.arrival.to_text(),
            "prediction": self.prediction.to_dict() if self.prediction else None,
            "capacity": self.capacity.to_dict() if self.capacity else None,
            "assumptions": list(self.assumptions),
            "profile": self.profile.to_dict(),
        }


def _read_profile(path: Path) -> Profile:
    if path.suffix == ".toml":
        return from_toml(path)
    return load_profile(path)


def _run_arrival(run_dir: Path) -> ArrivalProcess | None:
    """The arrival process a run measured with (its ``scenario.toml``; Poisson without one);
    None when it cannot be rebuilt (a trace file that is gone or changed)."""
    path = run_dir / "scenario.toml"
    if not path.is_file():
        return POISSON
    try:
        traffic = tomllib.loads(path.read_text(encoding="utf-8")).get("traffic", {})
        fields = {k: traffic[k] for k in ARRIVAL_KEYS if k in traffic}
        return TrafficSection.model_validate(fields).arrival_process()
    except (OSError, ValueError, InputError):
        return None


def _default_config(run_dir: Path | None) -> tuple[SimConfig | None, str]:
    """The run's chosen config (its best, else its baseline) and where it is from; without
    one, None and why not ("" when there is no run directory)."""
    if run_dir is None:
        return None, ""
    try:
        summary = records.load_summary(run_dir)
    except ResultFormatError as exc:
        return None, str(exc)
    for key, entry in (("best", summary.best), ("baseline", summary.baseline)):
        if entry is not None:
            if isinstance(entry.config, JointKnobs):
                return None, "it tuned a pipeline, and the simulator runs one model"
            if not isinstance(entry.config, Knobs):
                return None, "it tuned a generative engine, not a dynamic batcher"
            return SimConfig.from_knobs(entry.config), f"the run's {key} config"
    return None, "its summary names neither a best nor a baseline config"


def plan(request: PlanRequest) -> PlanReport:
    """Answer ``request`` from the profile alone.

    Raises:
        InputError: neither or both of rate and p99 given, no run directory or profile, no
            config to start from, invalid knobs.
        ExtrapolationError: the config needs batch sizes the profile does not cover.
        ProfileError: no profile can be built from what was given.
    """
    if (request.rate_rps is None) == (request.p99_ms is None):
        raise InputError(
            "give exactly one of --rate-rps (latency at a rate) or --p99-ms (capacity)"
        )
    if request.rate_rps is not None and request.rate_rps <= 0:
        raise InputError("--rate-rps must be positive")
    if request.p99_ms is not None and request.p99_ms <= 0:
        raise InputError("--p99-ms must be positive")
    if request.run_dir is None and request.profile_path is None and request.url is None:
        raise InputError("give a run directory, --profile FILE or --url URL --model NAME")
    if request.url is not None and not request.model:
        raise InputError("--url needs --model: the model whose batch sizes are probed")
    if request.run_dir is not None and not request.run_dir.is_dir():
        raise InputError(f"run directory {request.run_dir} does not exist")
    live: SimConfig | None = None
    if request.profile_path is not None:
        profile = _read_profile(request.profile_path)
    elif request.url is not None:
        assert request.model
        profile, live = probe_live(
            request.url, request.model, request.probe, request.inputs, request.access
        )
    else:
        assert request.run_dir is not None
        profile = from_run_dir(request.run_dir)
        # The run's own operating points calibrate the latency the server does not see, as the
        # sweep's predictions did: simulated with the arrivals they were measured with, which
        # need not be the ones asked about.
        points = [
            (SimConfig.from_knobs(k), rate, p99)
            for k, rate, p99 in run_operating_points(request.run_dir)
            if isinstance(k, Knobs)  # a pipeline's points calibrate no one model
        ]
        measured_with = _run_arrival(request.run_dir)
        offset = None
        if measured_with is not None:
            offset = latency_offset(profile, points, seed=request.seed, arrival=measured_with)
        if offset is not None:
            profile = replace(profile, latency_offset_ms=round(offset, 3))
    if request.save_profile is not None:
        save_profile(profile, request.save_profile)
    config, source = _default_config(request.run_dir)
    if config is None and live is not None:
        config, source = live, "the server's current config"
    flags = [
        name
        for name, value in (
            ("max_batch_size", request.max_batch_size),
            ("max_queue_delay_us", request.max_queue_delay_us),
            ("preferred_batch_size", request.preferred_batch_size),
            ("instance_count", request.instance_count),
        )
        if value is not None
    ]
    if config is None:
        if request.max_batch_size is None:
            why = f" ({source})" if source else ""
            raise InputError(
                f"no run config to start from{why}: give --max-batch-size (and the other knobs)"
            )
        config, source = SimConfig(max_batch_size=request.max_batch_size), "the flags"
    if flags:
        # A knob given on the command line means dynamic batching with that knob.
        config = SimConfig(
            max_batch_size=_pick(request.max_batch_size, config.max_batch_size),
            max_queue_delay_us=_pick(request.max_queue_delay_us, config.max_queue_delay_us),
            preferred_batch_size=_pick(request.preferred_batch_size, config.preferred_batch_size),
            instance_count=_pick(request.instance_count, config.instance_count),
            dynamic_batching=True,
        )
        source = f"{source} with {', '.join(flags)} from the flags"
    _check_knobs(config)
    profile.check_covers(config.largest_items(profile.items))
    if request.rate_rps is not None:
        pred = simulate(
            profile,
            config,
            request.rate_rps,
            requests=request.requests,
            seed=request.seed,
            arrival=request.arrival,
        )
        return PlanReport(profile, config, source, pred, None, arrival=request.arrival)
    assert request.p99_ms is not None
    cap = capacity(profile, config, request.p99_ms, seed=request.seed, arrival=request.arrival)
    return PlanReport(profile, config, source, None, cap, arrival=request.arrival)


def probe_live(
    url: str,
    model: str,
    probe_plan: ProbePlan | None = None,
    inputs: InputOptions | None = None,
    access: ServerAccess = PLAIN,
) -> tuple[Profile, SimConfig]:
    """Probe ``model`` on the server at ``url`` with ``inputs`` (the load's request data);
    the profile and the config it had before.

    The model's config is loaded back afterwards (also when the probe fails): the server is
    shared, and a probe config (one batch size, a one-second delay) must not stay on it.

    Raises:
        TargetError: the server cannot be reached, failed a request or refused a config.
        ProfileError: the model cannot be probed.
    """
    from analyzer.predict.probe import probe
    from analyzer.target.remote import RemoteTarget

    target = RemoteTarget(url, model, access=access)
    target.start()
    original = target.model_config()
    try:
        profile = probe(target, probe_plan, inputs=inputs)
    finally:
        target.load_config(original)
    return profile, SimConfig.from_model_config(original)


def _pick(flag: T | None, default: T) -> T:
    return default if flag is None else flag


def _check_knobs(config: SimConfig) -> None:
    if config.max_batch_size < 1:
        raise InputError("--max-batch-size must be >= 1")
    if config.max_queue_delay_us < 0:
        raise InputError("--max-queue-delay-us must be >= 0")
    if config.instance_count < 1:
        raise InputError("--instance-count must be >= 1")
    bad = [p for p in config.preferred_batch_size if p < 1 or p > config.max_batch_size]
    if bad:
        raise InputError(
            f"--preferred-batch-size: each size must be between 1 and max_batch_size {config.max_batch_size} "
            f"(got {', '.join(map(str, bad))})"
        )


def render_text(report: PlanReport) -> str:
    """The console answer: question, prediction, config, profile provenance, assumptions."""
    lines = [f"config: {report.config.describe()} ({report.config_source})"]
    if report.arrival != POISSON:
        lines.append(f"arrivals: {report.arrival.describe()}")
    if report.prediction is not None:
        p = report.prediction
        lines.append(
            f"predicted at {p.rate_rps:g} req/s: p50 {p.p50_ms:.2f} ms, p99 {p.p99_ms:.2f} ms, "
            f"mean {p.mean_ms:.2f} ms, throughput {p.throughput_rps:.1f} req/s over "
            f"{p.requests} requests"
            + (" (SATURATED: the rate is above capacity)" if p.saturated else "")
        )
        total = sum(p.batch_sizes.values()) or 1
        hist = ", ".join(f"{b}: {100.0 * n / total:.1f}%" for b, n in sorted(p.batch_sizes.items()))
        lines.append(f"batch sizes (share of executions): {hist}")
    if report.capacity is not None:
        c = report.capacity
        if c.at_capacity is None:
            lines.append(
                f"predicted capacity at p99 <= {c.p99_ms:g} ms: none (fails at {c.upper_rps:.1f} req/s)"
            )
        else:
            lines.append(
                f"predicted capacity at p99 <= {c.p99_ms:g} ms: {c.capacity_rps:.1f} req/s "
                f"(p99 there {c.at_capacity.p99_ms:.2f} ms; bracket {c.capacity_rps:.1f}-"
                f"{c.upper_rps:.1f} req/s, {len(c.steps)} simulated rates)"
            )
    prof = report.profile
    lines.append(
        f"profile: {prof.source}, batch sizes {prof.min_batch_size}-{prof.max_batch_size}, "
        f"jitter {prof.jitter:g}; {prof.provenance}"
    )
    if prof.latency_offset_ms:
        lines.append(
            f"latency offset {prof.latency_offset_ms:+.2f} ms on every simulated latency (what the "
            "server does not see, calibrated on the measured operating points)"
        )
    if prof.interference:
        ratios = ", ".join(f"{n} instances x{r:.2f}" for n, r in sorted(prof.interference.items()))
        lines.append(
            f"measured instance interference (execution time vs {prof.instances_profiled}): {ratios}"
        )
    if prof.overlap_ms:
        lines.append(
            f"host work inside compute_infer: {prof.overlap_ms:.2f} ms of every execution "
            "overlaps across instances (simulated as input-phase work)"
        )
    lines.append("assumptions:")
    lines.extend(f"  - {a}" for a in report.assumptions)
    return "\n".join(lines)
