"""Running one trial: the load generator, the baseline, one config measured and recorded.

``run_trial``: knobs -> ModelConfig -> ``trials/NNN/config.pbtxt`` -> repository load (no
restart) -> the evaluator's measurement -> a :class:`~analyzer.rundir.trial_record.TrialRecord`;
a config that kills the server twice is a finding (``CRASHED_REASON``), not a measurement.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.pipeline import TrialKnobs
from analyzer.config.scenario import Scenario
from analyzer.errors import TargetDiedError, TargetError
from analyzer.evaluation.plan import NEIGHBOUR_GROWTH, Expected, LoadPlan
from analyzer.measure.generator import LoadGenerator
from analyzer.measure.goals import goals_met
from analyzer.rundir.results import utc_now
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.strategy import nearest_capacity
from analyzer.sweep.state import CRASHED_REASON, SweepObserver, SweepState, first_line
from analyzer.target.protocol import ConfigRejectedError, Target, load_configs


@contextlib.contextmanager
def locust_generator(
    scenario: Scenario, target: Target, observer: SweepObserver, stages: tuple[str, ...] = ()
) -> Iterator[LoadGenerator]:
    """The sweep's load generator (``stages``: a pipeline's composing models, whose statistics
    every window reads with the pipeline's)."""
    from analyzer.load import LocustLoadGenerator  # gevent: only when measuring
    from analyzer.load.engine import engine_options
    from analyzer.measure.measurement import WindowStats
    from analyzer.measure.specs import LoadMode, LoadSpec

    def on_window(spec: LoadSpec, window: WindowStats) -> None:
        unit = "req/s" if spec.mode is LoadMode.REQUEST_RATE else "users"
        observer.on_phase(
            f"load {spec.target:g} {unit}: window {window.index + 1} "
            f"{window.throughput_rps:.1f} req/s, p99 {window.p99_ms:.1f} ms"
        )

    options = engine_options(
        scenario,
        target.url,
        target.model,
        # GPU utilisation, memory and power per window: the managed server's metrics port,
        # or --metrics-url for a --url server (None: the engine tries the HTTP port once).
        metrics_url=getattr(target, "metrics_url", "") or scenario.model.metrics_url or None,
        # model.protocol grpc: a managed server's own gRPC port; a --url server's HTTP port + 1.
        grpc_url=getattr(target, "grpc_url", "") or None,
        distributed=True,
        # Latency is timed from the intended send, so send lag is already in every p99; a lag
        # of a tenth of the goal cannot flip a verdict, so only more than that is "saturated".
        # The tightest goal counts: a class held to 60 ms is flipped by a 40 ms stall.
        max_send_lag_ms=max(10.0, 0.1 * scenario.tightest_p99_ms()),
        on_window=on_window,
        stage_models=stages,
    )
    if options.stream:  # goodput counts the requests that met the token goals
        options = replace(options, goals=LoadPlan(scenario).goals)
    with LocustLoadGenerator(options) as generator:
        yield generator


def measure_baseline(state: SweepState) -> TrialRecord:
    """The model's own config, measured once. With predictions its forecast capacity is
    checked, not searched for: a step below the forecast that must pass and one above it that
    must fail bracket the capacity (the gain's interval covers that bracket); a full capacity
    search runs only when either step disagrees with the forecast."""
    knobs, originals = state.tuned.knobs(), state.tuned.originals()
    state.run_dir.write_config(-1, originals)
    state.observer.on_trial_start(-1, "baseline", knobs, 0, state.scenario.budget.trials)
    forecast = state.guide.forecast(knobs) if state.guide is not None else None
    expect = None
    if forecast is not None and forecast.capacity_rps > 0 and state.objective.capacity:
        expect = Expected(forecast.capacity_rps, check=True)
    result = run_trial(state, -1, "baseline", knobs, originals, expect=expect)
    if forecast is not None:
        result = replace(result, prediction=forecast)
    state.run_dir.write_trial(result)
    state.observer.on_trial_end(result, None)
    return result


def run_trial(
    state: SweepState,
    number: int,
    source: str,
    knobs: TrialKnobs,
    configs: Sequence[mc.ModelConfig],
    factor: float = 1.0,
    near_rps: float | None = None,
    expect: Expected | None = None,
    check_rps: float | None = None,
    fails_at_rps: float | None = None,
) -> TrialRecord:
    """Load ``configs`` (one per tuned model) and measure them; a failure becomes a failed result, never an exception.

    ``check_rps``: one sequential step at that rate instead (validation); else the objective's
    measurement, its capacity search near ``near_rps`` or ``expect`` (an expected capacity and
    how to bracket it, :func:`expected_capacity`), below ``fails_at_rps`` when a rate is
    known to fail (validation).

    A server that dies during the trial (:class:`TargetDiedError`) is brought back by
    ``ensure_alive`` (a restart, or a wait for a ``--url`` server) and the trial runs again
    once; a second death makes the trial a finding: failed, ``crashed the server``.

    Raises:
        TargetDiedError: The server is dead and cannot be brought back: the sweep stops.
    """
    started_at, t0 = utc_now(), state.clock()
    failure = ""
    for attempt in (1, 2):
        try:
            state.target.ensure_alive()
        except TargetDiedError as exc:  # it cannot be brought back: the sweep stops
            state.server_event(number, source, "lost", first_line(exc))
            raise
        try:
            state.touched = True
            load_configs(state.target, configs, _files(state, knobs, configs))
            evaluation = (
                state.evaluator.check(check_rps, factor)
                if check_rps
                else state.evaluator.evaluate(
                    factor,
                    near_rps,
                    expected=expect,
                    fails_at_rps=fails_at_rps,
                )
            )
        except ConfigRejectedError as exc:
            failure = str(exc)
            break
        except TargetDiedError as exc:
            failure = first_line(exc)
            if attempt == 1:
                state.server_event(number, source, "died", failure)
                continue
            # The same config lost its server twice: the config is the finding.
            state.server_event(number, source, CRASHED_REASON, failure)
            failure = f"{CRASHED_REASON} twice: {failure}"
            state.target_failures += 1
            break
        except TargetError as exc:
            failure = str(exc)
            if attempt == 1:
                state.observer.on_phase(f"target failed ({exc}); retrying")
                continue
            state.target_failures += 1
            break
        except (OSError, RuntimeError, ValueError) as exc:  # load generator failures
            failure = f"{type(exc).__name__}: {exc}"
            break
        state.target_failures = 0
        numbers, constraints = evaluation.numbers, evaluation.constraints
        return TrialRecord(
            number=number,
            source=source,
            state="complete",
            config=knobs,
            throughput_rps=numbers["throughput_rps"],
            offered_rps=numbers["offered_rps"],
            p50_ms=numbers["p50_ms"],
            p90_ms=numbers["p90_ms"],
            p99_ms=numbers["p99_ms"] if math.isfinite(numbers["p99_ms"]) else 0.0,
            error_rate=numbers["error_rate"],
            # The one rule: a usable measurement, and every slack satisfied.
            meets_goals=goals_met(evaluation.measurement.problem(), constraints),
            constraints=dict(constraints),
            values=evaluation.values,
            started_at=started_at,
            duration_s=round(state.clock() - t0, 3),
            measurement=evaluation.measurement,
        )
    return TrialRecord(
        number=number,
        source=source,
        state="failed",
        config=knobs,
        failure=failure,
        started_at=started_at,
        duration_s=round(state.clock() - t0, 3),
    )


def _files(
    state: SweepState, knobs: TrialKnobs, configs: Sequence[mc.ModelConfig]
) -> dict[str, bytes]:
    """The files a trial's load sends (a vLLM engine's settings); none for the model's own
    config, whose own files on the server are what the baseline measures."""
    if tuple(configs) == state.tuned.originals() and knobs == state.tuned.knobs():
        return {}
    return state.tuned.files(knobs)


def expected_capacity(state: SweepState, knobs: TrialKnobs) -> Expected | None:
    """Where a trial's capacity search starts, and the growth that brackets it: the config's
    predicted capacity (small steps), else the capacity of the nearest finished trial, the
    baseline included (larger steps: a neighbour is a looser guess); None: neither is known."""
    if not state.objective.capacity:
        return None
    if state.guide is not None:
        prediction = state.guide.prediction(knobs)
        if prediction is not None and prediction.capacity_rps > 0:
            return Expected(prediction.capacity_rps)
    finished = [*state.results.values(), *([state.baseline] if state.baseline else [])]
    rps = nearest_capacity(state.search.space, knobs, finished)
    return None if rps is None else Expected(rps, NEIGHBOUR_GROWTH, predicted=False)
