"""What a sweep tunes: one model, or the composing models of a pipeline, searched together.

A pipeline is an ensemble (``platform: "ensemble"``: its steps name the models it calls) or a
BLS model (a Python model that calls others; its code cannot be read, so the scenario names
them: ``model.composing_models``). Load goes to the pipeline's own model and the goals are its
end-to-end latency and throughput; the knobs are every composing model's, one :class:`Knobs`
each, in :class:`JointKnobs`. :class:`Tuned` maps a trial's knobs to the configs it loads: one
for a plain model, one per composing model for a pipeline (the ensemble's own config is never
changed: it has no batcher).

Pure: no server, no sockets (the sweep reads the configs and hands them to :class:`Tuned`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import EngineKnobs, Knobs, engine_settings
from analyzer.config.model_config import apply_knobs, knobs_of
from reference_server.core.ensemble_config import composing_models

#: The platform of an ensemble (Triton's ``platform: "ensemble"``).
ENSEMBLE = "ensemble"


@dataclass(frozen=True)
class JointKnobs:
    """One :class:`Knobs` per composing model of a pipeline, in step order.

    The aggregate properties answer what the report and the records ask of any trial's knobs:
    instances in all (every stage's), dynamic batching (every stage batches).
    """

    stages: tuple[tuple[str, Knobs], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.stages]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a pipeline's knobs need distinct stage names: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.stages)

    def stage(self, name: str) -> Knobs:
        """The knobs of composing model ``name``."""
        return dict(self.stages)[name]

    @property
    def instance_count(self) -> int:
        return sum(k.instance_count for _, k in self.stages)

    @property
    def dynamic_batching(self) -> bool:
        return all(k.dynamic_batching for _, k in self.stages)

    def to_dict(self) -> dict[str, Any]:
        """``{"stages": {model: <Knobs.to_dict()>, ...}}`` in step order."""
        return {"stages": {name: knobs.to_dict() for name, knobs in self.stages}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JointKnobs:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple((name, Knobs.from_dict(k)) for name, k in data["stages"].items()))

    def label(self) -> str:
        """``pre: mbs=8 delay=0us pref=[-] x1 | infer: mbs=16 ... x2``."""
        return " | ".join(f"{name}: {knobs.label()}" for name, knobs in self.stages)


#: A trial's knobs: a plain model's, a pipeline's, or a generative engine's.
TrialKnobs = Knobs | JointKnobs | EngineKnobs


def config_cost(k: TrialKnobs) -> tuple[int, int, int]:
    """What a config costs to run, the cheapest first: instances, then max batch size, then queue
    delay (a pipeline's: summed over its stages). Ties in capacity go to the cheapest, and
    equal predictions rank it first."""
    if isinstance(k, JointKnobs):
        costs = [config_cost(s) for _, s in k.stages]
        return (sum(c[0] for c in costs), sum(c[1] for c in costs), sum(c[2] for c in costs))
    if isinstance(k, EngineKnobs):
        # Engines, then the running set, then the step's token budget.
        return (k.instance_count, k.max_num_seqs, k.max_num_batched_tokens)
    return (k.instance_count, k.max_batch_size, k.max_queue_delay_us)


def knobs_from_dict(data: Mapping[str, Any]) -> TrialKnobs:
    """The knobs a result file's ``config`` object holds (a pipeline's have ``stages``, an
    engine's ``engine``)."""
    if "stages" in data:
        return JointKnobs.from_dict(data)
    if data.get("engine"):
        return EngineKnobs.from_dict(data)
    return Knobs.from_dict(data)


def single(knobs: TrialKnobs) -> Knobs:
    """``knobs`` as one model's, for what models one model (the simulator, the probe)."""
    if isinstance(knobs, JointKnobs):
        raise ValueError(f"a pipeline's knobs ({', '.join(knobs.names)}) are not one model's")
    if isinstance(knobs, EngineKnobs):
        raise ValueError(f"an engine's knobs ({knobs.label()}) are not a dynamic batcher's")
    return knobs


def knob_cells(knobs: TrialKnobs) -> tuple[str, str, str, str]:
    """max batch size, queue delay (``off``: no dynamic batching), preferred sizes, instances
    as table cells; a pipeline's stages joined by ``/`` in step order (``8/16/8``)."""
    if isinstance(knobs, JointKnobs):
        cells = [knob_cells(k) for _, k in knobs.stages]
        return tuple("/".join(column) for column in zip(*cells, strict=True))  # type: ignore[return-value]
    if isinstance(knobs, EngineKnobs):
        # The same columns read as the engine's: running set, token budget, prefill, engines.
        return (
            str(knobs.max_num_seqs),
            str(knobs.max_num_batched_tokens),
            "chunked" if knobs.enable_chunked_prefill else "whole",
            str(knobs.instance_count),
        )
    return (
        str(knobs.max_batch_size),
        str(knobs.max_queue_delay_us) if knobs.dynamic_batching else "off",
        " ".join(str(s) for s in knobs.preferred_batch_size) or "-",
        str(knobs.instance_count),
    )


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == ENSEMBLE or config.WhichOneof("scheduling_choice") == (
        "ensemble_scheduling"
    )


def ensemble_steps(config: mc.ModelConfig) -> tuple[str, ...]:
    """The models an ensemble's steps call, in step order, each once (as the reference server
    loads them)."""
    return tuple(composing_models(config))


def stage_refusal(caller: str, config: mc.ModelConfig) -> str | None:
    """Why composing model ``config`` cannot be tuned, or None (``caller``: who calls it, e.g.
    ``step 2 of ensemble 'pipe'``, which the message names)."""
    name = config.name
    instead = (
        f"tune the other composing models by naming them (--composing-models), or {name!r} "
        "on its own"
    )
    if is_ensemble(config):
        return (
            f"{caller} calls {name!r}, itself an ensemble: nested ensembles are not "
            f"tuned; {instead}"
        )
    if config.model_transaction_policy.decoupled:
        return (
            f"{caller} calls {name!r}, a decoupled model (it answers a request "
            f"with any number of responses, so its batches are not requests): {instead}"
        )
    if config.WhichOneof("scheduling_choice") == "sequence_batching":
        return (
            f"{caller} calls {name!r}, a sequence-batched (stateful) model, whose "
            f"requests belong to sequences the pipeline's traffic does not carry: {instead}"
        )
    if config.max_batch_size == 0:
        return (
            f"{caller} calls {name!r}, which has max_batch_size 0 (no batch "
            f"dimension), so it cannot be batched: {instead}"
        )
    return None


#: Where Triton's vLLM backend (and the reference engine) keeps its engine settings, as the
#: repository load names a file beside ``config``.
ENGINE_FILE_KEY = "file:1/model.json"


def read_engine_file(repository: Path, model: str) -> dict[str, Any] | None:
    """A vLLM engine's own settings (``<model>/1/model.json``) in ``repository``, or None (not a
    vLLM engine's model, or unreadable)."""
    path = repository / model / ENGINE_FILE_KEY.removeprefix("file:")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def engine_of(config: mc.ModelConfig) -> str | None:
    """The generative engine that serves ``config`` (``vllm`` for Triton's vLLM backend and the
    reference engine, ``tensorrtllm`` for Triton's TensorRT-LLM backend), or None: a model
    Triton's batchers schedule."""
    backend = config.backend.lower()
    if backend == "vllm":
        return "vllm"
    if backend in ("tensorrtllm", "tensorrt_llm", "trtllm"):
        return "tensorrtllm"
    if backend == "sglang":  # a server started from a command (its stand-in config)
        return "sglang"
    return None


def engine_knobs_of(engine: str, settings: Mapping[str, Any], instances: int = 1) -> EngineKnobs:
    """The knobs an engine's own settings set (``model.json`` for vLLM, ``config.pbtxt``
    parameters for TensorRT-LLM); a setting left out takes the engine's default."""
    from analyzer.config.knobs import ENGINE_NAMES

    names = ENGINE_NAMES[engine]

    def get(knob: str, default: Any) -> Any:
        own = names[knob]
        return settings.get(own, default) if own is not None else default

    def flag(value: Any) -> bool:
        return value if isinstance(value, bool) else str(value).lower() == "true"

    memory = get("gpu_memory_utilization", None)
    policy = settings.get("batch_scheduler_policy") if engine == "tensorrtllm" else None
    return EngineKnobs(
        max_num_seqs=int(get("max_num_seqs", 256)),
        max_num_batched_tokens=int(get("max_num_batched_tokens", 2048)),
        enable_chunked_prefill=flag(get("enable_chunked_prefill", True)),
        gpu_memory_utilization=None if memory is None else float(memory),
        instance_count=instances,
        batch_scheduler_policy=None if policy in (None, "") else str(policy),
    )


@dataclass(frozen=True)
class Tuned:
    """What one sweep sets: the model it measures, and the configs a trial's knobs make.

    Attributes:
        base: The measured model's own config (the pipeline's, for a pipeline).
        stages: A pipeline's composing models' own configs, in step order; empty for a plain
            model, whose own config is tuned.
        engine: A generative model's engine (:data:`analyzer.config.knobs.ENGINES`): the knobs
            are :class:`EngineKnobs`; None for a model Triton's batchers schedule.
        engine_file: The vLLM engine's own settings (``1/model.json``) as found; each trial's
            file is this one with the knobs written over it (keys it does not tune, such as
            ``model``, kept).
    """

    base: mc.ModelConfig
    stages: tuple[mc.ModelConfig, ...] = ()
    engine: str | None = None
    engine_file: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, base: mc.ModelConfig, stages: Sequence[mc.ModelConfig] = ()) -> Tuned:
        return cls(base, tuple(stages))

    @property
    def pipeline(self) -> bool:
        return bool(self.stages)

    @property
    def names(self) -> tuple[str, ...]:
        """The models whose configs the sweep sets."""
        return tuple(c.name for c in self.stages) if self.stages else (self.base.name,)

    def originals(self) -> tuple[mc.ModelConfig, ...]:
        """The configs the sweep found (what restoring loads back)."""
        return self.stages or (self.base,)

    def knobs(self) -> TrialKnobs:
        """The knobs of the configs as found (the baseline's)."""
        if self.engine is not None:
            return self._engine_knobs_of(self.base)
        return self.knobs_of(self.originals())

    def configs(self, knobs: TrialKnobs) -> tuple[mc.ModelConfig, ...]:
        """The configs that ``knobs`` make, one per tuned model (loaded in this order)."""
        if isinstance(knobs, EngineKnobs):
            return (self._engine_config(knobs),)
        if self.engine is not None:
            raise ValueError(f"a batcher's knobs do not fit the {self.engine} engine's model")
        if isinstance(knobs, JointKnobs):
            if not self.stages or knobs.names != self.names:
                raise ValueError(f"knobs for {knobs.names} do not fit the models {self.names}")
            return tuple(apply_knobs(c, knobs.stage(c.name)) for c in self.stages)
        if self.stages:
            raise ValueError(f"one model's knobs do not fit the pipeline's models {self.names}")
        return (apply_knobs(self.base, knobs),)

    def files(self, knobs: TrialKnobs) -> dict[str, bytes]:
        """The files a repository load sends beside ``config`` for ``knobs`` (``file:<path>``
        to contents): the engine's settings as vLLM's ``1/model.json`` (a server started from a
        command reads its knobs back from it); empty for TensorRT-LLM, whose settings are
        ``config.pbtxt`` parameters, and for every model Triton's batchers schedule."""
        if not isinstance(knobs, EngineKnobs) or self.engine in (None, "tensorrtllm"):
            return {}
        settings = {**(self.engine_file or {}), **engine_settings(knobs, "vllm")}
        return {ENGINE_FILE_KEY: (json.dumps(settings, indent=2) + "\n").encode()}

    def knobs_of(self, configs: Sequence[mc.ModelConfig]) -> TrialKnobs:
        """The knobs ``configs`` (one per tuned model, as :meth:`configs` makes) set."""
        if self.engine is not None:
            return self._engine_knobs_of(configs[0])
        if not self.stages:
            return knobs_of(configs[0])
        return JointKnobs(tuple((c.name, knobs_of(c)) for c in configs))

    def _engine_knobs_of(self, config: mc.ModelConfig) -> EngineKnobs:
        assert self.engine is not None
        instances = sum(max(g.count, 1) for g in config.instance_group) or 1
        if self.engine == "tensorrtllm":
            settings = {k: v.string_value for k, v in config.parameters.items()}
            return engine_knobs_of(self.engine, settings, instances)
        return engine_knobs_of(self.engine, self.engine_file or {}, instances)

    def _engine_config(self, knobs: EngineKnobs) -> mc.ModelConfig:
        """The base config with the engine count (and TensorRT-LLM's parameters) set."""
        if self.engine is None:
            raise ValueError(f"an engine's knobs ({knobs.label()}) need a generative model")
        config = mc.ModelConfig()
        config.CopyFrom(self.base)
        if config.instance_group:
            del config.instance_group[1:]
            config.instance_group[0].count = knobs.instance_count
        elif knobs.instance_count != 1:
            config.instance_group.add(count=knobs.instance_count)
        if self.engine == "tensorrtllm":
            for key, value in engine_settings(knobs, "tensorrtllm").items():
                config.parameters[key].string_value = value
        return config
