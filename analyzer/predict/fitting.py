"""A profile fitted from a perfsweep run directory's measured windows (:func:`from_run_dir`).

Every level the trials measured carries, per window, the server's executions per batch size
and the per-request mean of each compute phase; a least-squares fit of ``a + c * batch`` per
phase gives the profile (:func:`fit_windows`), or rescales a probed one (:func:`rescaled`).
Also the operating points a run measured (:func:`run_operating_points`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from analyzer.config.pipeline import TrialKnobs
from analyzer.errors import ResultFormatError
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadMode
from analyzer.predict import ProfileError
from analyzer.predict.profile import BatchTiming, Profile
from analyzer.rundir import records
from analyzer.rundir.measurements import TrialMeasurement
from analyzer.rundir.results import RunDirectory
from analyzer.rundir.trial_record import TrialRecord

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

    A record :func:`analyzer.rundir.records.load_trial` refuses (half-written, foreign, a version
    this perfsweep cannot read) is left out: the others still count.
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
) -> list[tuple[TrialKnobs, float, float]]:
    """(config, offered rate, p99) of every trial whose operating point is an open-loop level
    that met the goals: where a profile's latency offset is calibrated
    (:func:`analyzer.predict.capacity.latency_offset`)."""
    points = []
    for r in trials:
        m = r.operating_point() if r.complete and r.meets_goals else None
        if m is None or m.mode is not LoadMode.REQUEST_RATE or m.target <= 0:
            continue
        points.append((r.config, m.target, m.p99_ms))
    return points


def model_operating_points(
    trials: Iterable[TrialRecord],
) -> list[tuple[TrialKnobs, float, dict[str, float]]]:
    """(config, offered rate, each model's p99) of every trial of a mix of models whose
    operating point is an open-loop level that met the goals: each model's p99 is its traffic
    class's (the worst of its classes where it has several); trials whose classes name no
    model are left out. Where a mix's latency offsets are calibrated
    (:func:`analyzer.predict.mix_sim.mix_offsets`)."""
    points = []
    for r in trials:
        m = r.operating_point() if r.complete and r.meets_goals else None
        if m is None or m.mode is not LoadMode.REQUEST_RATE or m.target <= 0:
            continue
        p99s: dict[str, float] = {}
        for c in m.classes:
            if c.model and c.request_count > 0:
                p99s[c.model] = max(p99s.get(c.model, 0.0), c.p99_ms)
        if p99s:
            points.append((r.config, m.target, p99s))
    return points


def run_operating_points(run_dir: Path) -> list[tuple[TrialKnobs, float, float]]:
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
