"""The reference server simulated in virtual time: ``perfsweep run --server virtual``.

A sweep's two seams answered by this package's simulators instead of a server and Locust:
:class:`VirtualServer` is the :class:`~analyzer.target.protocol.Target` (the model repository's
configs in memory; a trial's config is "loaded" by replacing one), :class:`VirtualLoad` the
:class:`~analyzer.measure.generator.LoadGenerator`. Every level runs the trial's configs in the
discrete-event simulator on each model's simulated-device profile, the one the reference
server's simulated backend would execute (the config's ``profile`` parameter; the bundled
``resnet50`` with ``--device sim``): one model in :mod:`~analyzer.predict.simulator`, a
pipeline's stages in :mod:`~analyzer.predict.pipeline_sim`, a mix's models on one device in
:mod:`~analyzer.predict.mix_sim`. A :class:`VirtualClock` advances by each level's length (its
warm-up and its requests at the offered rate), so time budgets, phase times and trial durations
read as they would against the server, and a 20-trial sweep takes seconds.

What it is for: trying a space, a budget or a goal before a server is touched, and testing the
sweep's behaviour (stop rules, validation, resume, records) in seconds. What it is not: a
measurement. Its figures are the simulator's (latency = queue + execution, no network or
protocol offset), its levels are open-loop only, and configs the simulator does not model
(priority levels, queue policies, response caches) are refused as a server refuses a config.
The summary's target says ``virtual``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.pipeline import ensemble_steps, is_ensemble
from analyzer.config.scenario import Scenario
from analyzer.errors import InputError
from analyzer.measure.capacity import CapacityResult, find_capacity
from analyzer.measure.measurement import ClassStats, Measurement, ServerView
from analyzer.measure.specs import CapacitySpec, LoadMode, LoadSpec
from analyzer.measure.stepping import SequentialRule, StepRecord, StepVerdict
from analyzer.predict.mix_sim import MixModel, MixProfile, simulate_mix
from analyzer.predict.pipeline_sim import PipelineProfile, simulate_pipeline
from analyzer.predict.profile import Profile
from analyzer.predict.sim_records import Prediction, SimConfig, check_modelled
from analyzer.predict.simulator import simulate
from analyzer.predict.sources import from_toml
from analyzer.target.protocol import ConfigRejectedError

__all__ = ["VirtualClock", "VirtualLoad", "VirtualServer", "virtual_seams"]

#: Fewest and most requests one fixed-window level simulates (a sequential step simulates
#: what its test needs, up to the test's cap).
MIN_LEVEL_REQUESTS = 500
MAX_LEVEL_REQUESTS = 20_000
#: A sequential step's windows: half a second of requests, at least this many.
MIN_WINDOW_REQUESTS = 50
#: Latency a level that could not keep up reports (the simulation stopped: the p99 is unbounded).
OVERLOADED_MS = 60_000.0


class VirtualClock:
    """A monotonic clock that only moves when told: each simulated level advances it."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (never back)."""
        self.now_s += max(0.0, seconds)


def _say_nothing(message: str) -> None:
    """A target's ``notify`` until the sweep's view sets one."""


@dataclass
class VirtualServer:
    """A Target whose models are configs in memory and whose device is a profile.

    Attributes:
        model: The model the load goes to.
        configs: Every model's config as the server would report it (name -> config).
        profiles: Each simulated model's profile (name -> profile).
        stages: A pipeline's composing models in the order requests pass them (empty: none).
    """

    model: str
    configs: dict[str, mc.ModelConfig]
    profiles: dict[str, Profile]
    stages: tuple[str, ...] = ()
    url: str = "virtual://reference-server"
    device: str = "sim"
    shared: bool = False
    access: ServerAccess = PLAIN
    clock: VirtualClock = field(default_factory=VirtualClock)
    #: Config loads so far (one per model per trial).
    loads: int = 0
    #: The files each model's last load sent (a generative engine's settings).
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Set here, not as a field: a callable field reads as a method to type checkers, and
        # the Target protocol needs it settable (the live view sets it).
        self.notify: Callable[[str], None] = _say_nothing

    @classmethod
    def of(cls, scenario: Scenario) -> VirtualServer:
        """The server the scenario's managed reference server would be: the model repository's
        configs (the bundled ``resnet50`` on the simulated device without one) and each tuned
        model's simulated-device profile.

        Raises:
            InputError: A model is missing, is not on the simulated backend, or its profile
                cannot be read.
        """
        m = scenario.model
        if m.url:
            raise InputError("--server virtual simulates a server: it takes no --url")
        largest = scenario.space.max_batch_size[1]
        configs = _repository(scenario)
        base = configs.get(m.name)
        if base is None:
            raise InputError(f"model {m.name!r} is not in the model repository {m.repository}")
        stages: tuple[str, ...] = ()
        if is_ensemble(base):
            stages = ensemble_steps(base)
        elif m.composing_models:
            stages = tuple(m.composing_models)
        tuned = scenario.mix() or stages or (m.name,)
        profiles = {}
        for name in tuned:
            config = configs.get(name)
            if config is None:
                raise InputError(f"model {name!r} is not in the model repository {m.repository}")
            profiles[name] = _profile(config, m.repository, max(largest, config.max_batch_size))
        return cls(m.name, configs, profiles, stages)

    # -- Target ------------------------------------------------------------------------------

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def model_config(self) -> mc.ModelConfig:
        config = self.config_of(self.model)
        assert config is not None
        return config

    def config_of(self, name: str) -> mc.ModelConfig | None:
        config = self.configs.get(name)
        if config is None:
            return None
        copy = mc.ModelConfig()
        copy.CopyFrom(config)
        return copy

    def load_config(
        self,
        config: mc.ModelConfig,
        *,
        wait_for_model: bool = True,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Take ``config`` as model ``config.name``'s (the tuned model's when it names none),
        refused as the reference server refuses it, or where the simulator cannot run it
        (``files``, a generative engine's settings, are kept per model in :attr:`files`)."""
        self.files[config.name or self.model] = dict(files or {})
        name = config.name or self.model
        if name not in self.configs:
            raise ConfigRejectedError(f"load of {name!r} failed: no such model in the repository")
        # Round-trip through the JSON override, as the repository load API receives it.
        text = json_format.MessageToJson(config, preserving_proto_field_name=True)
        parsed = json_format.Parse(text, mc.ModelConfig())
        if not parsed.name:
            parsed.name = name
        if parsed.max_batch_size < 1 and name in self.profiles:
            raise ConfigRejectedError(f"load of {name!r} failed: max_batch_size must be >= 1")
        for size in parsed.dynamic_batching.preferred_batch_size:
            if size > parsed.max_batch_size:
                raise ConfigRejectedError(
                    f"load of {name!r} failed: preferred_batch_size {size} is larger than "
                    f"max_batch_size {parsed.max_batch_size}"
                )
        if name in self.profiles:
            try:
                check_modelled(SimConfig.from_model_config(parsed))
                self.profiles[name].check_covers(parsed.max_batch_size)
            except InputError as exc:
                raise ConfigRejectedError(
                    f"the virtual server cannot run this config of {name!r}: {exc}"
                ) from exc
        self.loads += 1
        self.configs[name] = parsed

    def ensure_alive(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "virtual",
            "url": self.url,
            "device": "sim (virtual time)",
            "server": "reference server, simulated in virtual time (perfsweep run --server virtual)",
            "profiles": {name: p.provenance for name, p in self.profiles.items()},
        }

    # -- the simulation ---------------------------------------------------------------------

    def sim_configs(self) -> dict[str, SimConfig]:
        """The simulated models' current configs."""
        return {name: SimConfig.from_model_config(self.configs[name]) for name in self.profiles}

    def profile(self, target: Any, scenario: Scenario) -> Profile:
        """The profile phase (a :data:`~analyzer.sweep.state.Profiler`): the model's own
        profile, exactly what the simulated device executes."""
        name = getattr(target, "model", self.model)
        return self.profiles[name]


def _repository(scenario: Scenario) -> dict[str, mc.ModelConfig]:
    """Every model config of the scenario's repository (the bundled model's without one)."""
    m = scenario.model
    if m.repository is None:
        from reference_server.zoo.resnet50 import MODEL_NAME, baseline_config

        if m.name != MODEL_NAME or m.device != "sim":
            raise InputError(
                "--server virtual simulates the simulated device: use --model resnet50 --device "
                'sim, or a --model-repository whose models have backend "simulated"'
            )
        return {MODEL_NAME: baseline_config("sim")}
    configs = {}
    for path in sorted(Path(m.repository).glob("*/config.pbtxt")):
        config = mc.ModelConfig()
        try:
            text_format.Parse(path.read_text(encoding="utf-8"), config, allow_unknown_field=True)
        except (OSError, text_format.ParseError) as exc:
            raise InputError(f"{path}: cannot read the model config ({exc}); fix it") from exc
        config.name = config.name or path.parent.name
        configs[config.name] = config
    return configs


def _profile(config: mc.ModelConfig, repository: Path | None, largest: int) -> Profile:
    """The profile the simulated backend executes for ``config``, up to batch ``largest``."""
    if config.backend != "simulated":
        raise InputError(
            f"--server virtual simulates models on the simulated backend; model {config.name!r} "
            f"uses backend {config.backend or config.platform or 'unknown'!r}: give it backend "
            '"simulated" and a profile parameter, or sweep it on a server'
        )
    ref = config.parameters["profile"].string_value or "resnet50_sim"
    if repository is not None and (Path(repository) / config.name / ref).is_file():
        ref = str(Path(repository) / config.name / ref)
    return from_toml(ref, max_batch_size=largest, model=config.name)


@dataclass
class VirtualLoad:
    """A LoadGenerator that simulates each level on the server's current configs.

    Each level simulates the rate's arrivals (the level's arrival process and seed) through
    the configs loaded now: a fixed-window level its warm-up and windows' worth of requests,
    a sequential step as many as its test needs (windows of half a second, fed to the same
    :class:`~analyzer.measure.stepping.SequentialRule` as the Locust engine's). A mix's
    classes get each model's figures.
    """

    server: VirtualServer
    scenario: Scenario
    #: Levels simulated so far.
    levels: int = 0

    def measure(self, spec: LoadSpec) -> Measurement:
        if spec.mode is not LoadMode.REQUEST_RATE:
            raise InputError(
                "--server virtual simulates open-loop load (a request rate): the simulator has "
                'no closed loop; use traffic.mode = "rate"'
            )
        self.levels += 1
        rate = spec.target
        warm = round(rate * spec.warmup_s)
        if spec.sequential is not None:
            measured, step = self._sequential(spec, warm)
        else:
            span_s = (spec.window_s or 1.0) * max(1, spec.stable_windows)
            n = min(MAX_LEVEL_REQUESTS, max(MIN_LEVEL_REQUESTS, round(rate * span_s)))
            measured, step = self._run(spec, warm + n, warm), None
        m = self._measurement(spec, measured, step)
        self.server.clock.advance(spec.warmup_s + m.duration_s)
        return m

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        return find_capacity(spec, self.measure)

    # -- one level --------------------------------------------------------------------------

    def _run(self, spec: LoadSpec, requests: int, warm: int) -> _Level:
        """Simulate ``requests`` arrivals (the first ``warm`` not measured) at the level's rate."""
        server, rate = self.server, spec.target
        configs = server.sim_configs()
        common = {
            "requests": requests,
            "warmup": min(warm, requests - 1),
            "seed": spec.seed,
            "arrival": spec.arrival,
            "keep_latencies": True,
        }
        if mix := self.scenario.mix_shares_goals():
            models = tuple(
                MixModel(name, server.profiles[name], share, p99, own)
                for name, share, p99, own in mix
            )
            predicted = simulate_mix(MixProfile(models), configs, rate, **common)  # type: ignore[arg-type]
            return _Level(predicted.combined, predicted.models)
        if server.stages:
            pipeline = PipelineProfile(tuple((s, server.profiles[s]) for s in server.stages))
            return _Level(simulate_pipeline(pipeline, configs, rate, **common))  # type: ignore[arg-type]
        name = server.model
        return _Level(simulate(server.profiles[name], configs[name], rate, **common))  # type: ignore[arg-type]

    def _sequential(self, spec: LoadSpec, warm: int) -> tuple[_Level, StepRecord]:
        """A sequential step: windows of the level's window length fed to the rule until it
        decides, simulating more requests while it has not, up to the test's cap or the
        level's ``max_windows`` windows (BOUNDARY), as the Locust engine stops a step."""
        assert spec.sequential is not None
        test = spec.sequential
        window = max(MIN_WINDOW_REQUESTS, round(spec.target * (spec.window_s or 1.0)))
        cap = min(test.max_requests, window * max(1, spec.max_windows))
        n = min(cap, max(4 * test.min_requests, 4 * window))
        while True:
            level = self._run(spec, warm + n, warm)
            latencies = level.latencies()
            rule = SequentialRule.for_test(test)
            used = 0
            for start in range(0, len(latencies), window):
                chunk = latencies[start : start + window]
                record = rule.update(chunk)
                used = start + len(chunk)
                if record.verdict.final:
                    return level.first(used), record
            if not latencies:
                # The simulation stopped: more than 1 % of its requests could not be served.
                return level, rule.stop(StepVerdict.FAIL, "the server could not keep up")
            if n >= cap:
                return level.first(used), rule.stop(
                    StepVerdict.BOUNDARY, f"the level's cap of {n} requests"
                )
            n = min(cap, 2 * n)

    def _measurement(self, spec: LoadSpec, level: _Level, step: StepRecord | None) -> Measurement:
        p = level.prediction
        latencies = np.asarray(level.latencies()) if level.latencies() else None
        overloaded = latencies is None or p.saturated

        def q(share: float) -> float:
            if latencies is None:
                return OVERLOADED_MS
            return float(np.quantile(latencies, share, method="inverted_cdf"))

        rate = spec.target
        measured = len(latencies) if latencies is not None else 0
        profiles = self.server.profiles
        if level.models:  # a mix: each model's statistics, as the server keeps them apart
            stages = {
                name: _view(m.batch_sizes, len(m.latencies_ms), profiles[name])
                for name, m in level.models.items()
            }
            # The level's own statistics are those of the model the load is addressed to.
            own = stages.get(self.server.model) or _view({}, measured)
        elif self.server.stages:  # a pipeline: each stage saw every request
            stages = {
                name: _view(h, measured, profiles.get(name))
                for name, h in p.stage_batch_sizes.items()
            }
            # The pipeline's own model (an ensemble, a BLS model) executes each request once,
            # as the reference server's ensemble records it.
            own = _view({1: measured} if measured else {}, measured)
        else:
            stages = {}
            own = _view(p.batch_sizes, measured, profiles.get(self.server.model))
        server = replace(own, stages=stages)
        messages = (
            (
                "the simulated server could not keep up with this rate (its queue grew without "
                "bound)",
            )
            if overloaded
            else ()
        )
        return Measurement(
            mode=LoadMode.REQUEST_RATE,
            target=rate,
            throughput_rps=p.throughput_rps if math.isfinite(p.throughput_rps) else 0.0,
            p50_ms=q(0.50),
            p90_ms=q(0.90),
            p95_ms=q(0.95),
            p99_ms=q(0.99),
            p999_ms=q(0.999),
            mean_ms=float(latencies.mean()) if latencies is not None else OVERLOADED_MS,
            max_ms=float(latencies.max()) if latencies is not None else OVERLOADED_MS,
            request_count=max(1, measured),
            error_count=0,
            stable=not overloaded,
            valid=True,
            send_lag_p99_ms=0.0,
            server=server,
            arrival=spec.arrival.to_text(),
            offered_rps=rate,
            duration_s=measured / rate,
            step=step,
            classes=self._classes(level),
            messages=messages,
        )

    def _classes(self, level: _Level) -> tuple[ClassStats, ...]:
        """A mix's classes, each with its model's figures."""
        if not level.models:
            return ()
        out = []
        for c in self.scenario.traffic.classes:
            name = c.model or self.scenario.model.name
            p = level.models[name]
            lat = np.asarray(p.latencies_ms) if p.latencies_ms else None
            out.append(
                ClassStats(
                    name=c.name,
                    priority=c.priority,
                    share=c.share,
                    request_count=len(p.latencies_ms),
                    p50_ms=float(np.quantile(lat, 0.5)) if lat is not None else OVERLOADED_MS,
                    p90_ms=float(np.quantile(lat, 0.9)) if lat is not None else OVERLOADED_MS,
                    p99_ms=float(np.quantile(lat, 0.99)) if lat is not None else OVERLOADED_MS,
                    model=name,
                )
            )
        return tuple(out)


def _view(histogram: dict[int, int], requests: int, profile: Profile | None = None) -> ServerView:
    """What the server's statistics would say of a level: its successes and batches, and with
    the model's ``profile`` its compute times (per request, as Triton averages them: each
    request of a batch counts the batch's time; the queue time is not simulated per request)."""
    executions = sum(histogram.values())
    items = sum(size * count for size, count in histogram.items())
    times = {"input": 0.0, "infer": 0.0, "output": 0.0}
    infer_total_us = 0.0
    if profile is not None and items:
        for size, count in histogram.items():
            t = profile.timing(size)
            times["input"] += size * count * t.input_ms
            times["infer"] += size * count * t.infer_ms
            times["output"] += size * count * t.output_ms
            infer_total_us += 1000.0 * count * t.infer_ms
        times = {phase: 1000.0 * ms / items for phase, ms in times.items()}
    return ServerView(
        success_count=requests,
        inference_count=items,
        execution_count=executions,
        avg_batch_size=items / executions if executions else 0.0,
        compute_input_us=times["input"],
        compute_infer_us=times["infer"],
        compute_output_us=times["output"],
        batch_sizes=dict(histogram),
        execution_compute_infer_us=infer_total_us,
    )


@dataclass(frozen=True)
class _Level:
    """One simulated level: the (combined) prediction and, in a mix, each model's."""

    prediction: Prediction
    models: dict[str, Prediction] = field(default_factory=dict)
    limit: int | None = None

    def latencies(self) -> Sequence[float]:
        """The measured requests' latencies in arrival order (up to :attr:`limit`)."""
        if self.models:
            # Each model's requests spread over the level as they arrived: merged by their
            # place in their own stream (the draw is independent of time).
            keyed = [
                ((i + 0.5) / len(p.latencies_ms), lat)
                for p in self.models.values()
                for i, lat in enumerate(p.latencies_ms)
            ]
            kept: Sequence[float] = [lat for _, lat in sorted(keyed)]
        else:
            kept = self.prediction.latencies_ms
        return kept if self.limit is None else kept[: self.limit]

    def first(self, n: int) -> _Level:
        """The level as if it had stopped after ``n`` measured requests."""
        return replace(self, limit=n)


def virtual_seams(
    scenario: Scenario,
) -> tuple[VirtualServer, VirtualLoad, VirtualClock, Callable[[Any, Scenario], Profile]]:
    """The target, load generator, clock and profiler of a sweep in virtual time."""
    server = VirtualServer.of(scenario)
    return server, VirtualLoad(server, scenario), server.clock, server.profile
