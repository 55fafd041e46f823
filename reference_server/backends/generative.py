"""The reference engine: a generative backend that batches per iteration on a simulated device.

It plays Triton's vLLM backend (backend name ``vllm``): a decoupled model (``max_batch_size:
0``) whose ``execute`` hands each request to an engine thread and returns at once; the engine
answers through the request's response sender, one response per token when streaming, the
last one flagged final.

The engine thread steps :func:`reference_server.batching.iteration.decide_step` (vLLM V1's
scheduling rules) in a loop. A step lasts ``fixed_ms + prefill_ms_per_token * prefill tokens +
decode_ms_per_seq * decoding sequences`` (the profile's ``[step]`` table, times a seeded
gaussian jitter), booked on the simulated device's timeline so ``nv_gpu_utilization`` sees it.

Engine settings come from ``<model>/<version>/model.json`` as Triton's vLLM backend keeps them
(:class:`EngineSettings`; keys it does not model, such as ``model``, are ignored). The KV
cache has ``floor((memory_total_mb * gpu_memory_utilization - weights_mb - context_mb) * MiB /
(kv bytes_per_token * block_size))`` blocks (:func:`kv_cache_blocks`): vLLM's rule, with the
profile's weights and context standing in for the memory vLLM profiles at start-up.

Requests (the inputs of Triton's vLLM backend): ``text_input`` (its whitespace-separated words
are its tokens), optional ``stream`` (bool), ``sampling_parameters`` (a JSON string; without it
the request's parameters are read: ``max_tokens`` (default 16), ``min_tokens``,
``ignore_eos``), ``exclude_input_in_output``. Each generated token is one word (`` tok<n>``).
Without ``ignore_eos`` a token past ``min_tokens`` ends the sequence with probability
:data:`EOS_PROBABILITY`, drawn from the seeded RNG.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from reference_server.backends.base import BackendArgs
from reference_server.batching.iteration import (
    EngineLimits,
    EngineState,
    Seq,
    abort,
    admissible,
    complete_step,
    decide_step,
)
from reference_server.core.errors import BackendError, Code, ModelConfigError, ServerError
from reference_server.core.types import InferRequest, InferResponse
from reference_server.zoo.profiles import LatencyProfile, resolve_profile

#: The engine-settings file of Triton's vLLM backend, in the model's version folder.
ENGINE_FILE = "model.json"

#: Chance that a sampled token is an end-of-sequence token (without ``ignore_eos``).
EOS_PROBABILITY = 0.02

_MIB = 1024 * 1024

#: Sends one response of a request; ``final`` marks its last (Triton's COMPLETE_FINAL flag).
Sender = Callable[[InferResponse | ServerError, bool], None]


@dataclass(frozen=True)
class EngineSettings:
    """The engine arguments the reference engine models (vLLM's names and defaults).

    Attributes:
        max_num_seqs: Most sequences running at once.
        max_num_batched_tokens: Most tokens one step carries.
        enable_chunked_prefill: Prefill a long prompt over several steps.
        gpu_memory_utilization: Share of the device memory the engine may use (weights + KV).
        block_size: Tokens per KV-cache block.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.9
    block_size: int = 16

    @classmethod
    def from_json(cls, data: Any, where: str) -> EngineSettings:
        """Read the modelled keys of a ``model.json`` object (others are vLLM's, ignored).

        Raises:
            ModelConfigError: a modelled key has a wrong type or value.
        """
        if not isinstance(data, dict):
            raise ModelConfigError(f"{where} must hold a JSON object of engine arguments")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            raw = data[f.name]
            if f.type == "bool":
                if isinstance(raw, str) and raw.lower() in ("true", "false"):
                    raw = raw.lower() == "true"
                if not isinstance(raw, bool):
                    raise ModelConfigError(f"{where}: '{f.name}' must be true or false")
            elif f.type == "int":
                if isinstance(raw, str) and raw.strip().isdigit():
                    raw = int(raw)
                if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
                    raise ModelConfigError(f"{where}: '{f.name}' must be a positive integer")
            else:
                try:
                    raw = float(raw)
                except (TypeError, ValueError):
                    raise ModelConfigError(f"{where}: '{f.name}' must be a number") from None
                if not 0.0 < raw <= 1.0:
                    raise ModelConfigError(f"{where}: '{f.name}' must be in (0, 1], got {raw}")
            values[f.name] = raw
        return cls(**values)


def kv_cache_blocks(settings: EngineSettings, profile: LatencyProfile) -> int:
    """KV-cache blocks that the memory share leaves after weights and context.

    Raises:
        ModelConfigError: the profile lacks ``[gpu]`` or ``[kv]``, or nothing is left.
    """
    if profile.gpu is None or profile.kv is None:
        raise ModelConfigError(
            f"latency profile '{profile.name}' needs [gpu] and [kv] tables for a generative model"
        )
    gpu = profile.gpu
    usable_mb = gpu.memory_total_mb * settings.gpu_memory_utilization
    kv_mb = usable_mb - gpu.weights_mb - gpu.context_mb
    blocks = math.floor(kv_mb * _MIB / (profile.kv.bytes_per_token * settings.block_size))
    if blocks < 1:
        raise ModelConfigError(
            f"gpu_memory_utilization {settings.gpu_memory_utilization} gives {usable_mb:.0f} MiB "
            f"of {gpu.memory_total_mb:.0f} MiB, which the weights ({gpu.weights_mb:.0f} MiB) and "
            f"context ({gpu.context_mb:.0f} MiB) fill: no room for the KV cache; raise "
            "gpu_memory_utilization in model.json"
        )
    return blocks


def prompt_tokens_of(text: str) -> int:
    """The reference engine's token count of a text: its whitespace-separated words."""
    return len(text.split())


def token_text(index: int) -> str:
    """The text of the ``index``-th generated token (one word)."""
    return f" tok{index}"


@dataclass(frozen=True)
class GenerateParams:
    """What one request asks of the engine."""

    prompt: str
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    exclude_input: bool


def _scalar(request: InferRequest, name: str) -> Any:
    array = request.inputs.get(name)
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def parse_request(request: InferRequest) -> GenerateParams:
    """Read a request's inputs the way Triton's vLLM backend does.

    Raises:
        ServerError: INVALID_ARG with what is wrong.
    """
    prompt = _scalar(request, "text_input")
    if not isinstance(prompt, str):
        raise ServerError("input 'text_input' must hold one string", Code.INVALID_ARG)
    raw = _scalar(request, "sampling_parameters")
    params: dict[str, Any]
    if raw is not None:
        try:
            params = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            raise ServerError(
                f"input 'sampling_parameters' is not JSON: {exc.msg}", Code.INVALID_ARG
            ) from exc
        if not isinstance(params, dict):
            raise ServerError("input 'sampling_parameters' must be a JSON object", Code.INVALID_ARG)
    else:
        params = dict(request.parameters)
    stream = _scalar(request, "stream")
    if stream is None:
        stream = params.get("stream", False)
    exclude = _scalar(request, "exclude_input_in_output")

    def int_param(name: str, default: int) -> int:
        value = params.get(name, default)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ServerError(f"sampling parameter '{name}' must be an integer", Code.INVALID_ARG)
        return value

    def bool_param(value: Any, name: str) -> bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ServerError(f"'{name}' must be true or false", Code.INVALID_ARG)
        return value

    max_tokens = int_param("max_tokens", 16)
    min_tokens = int_param("min_tokens", 0)
    if min_tokens < 0 or min_tokens > max_tokens:
        raise ServerError(
            f"min_tokens must be in [0, max_tokens={max_tokens}], got {min_tokens}",
            Code.INVALID_ARG,
        )
    return GenerateParams(
        prompt=prompt,
        prompt_tokens=prompt_tokens_of(prompt),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool_param(params.get("ignore_eos", False), "ignore_eos"),
        stream=bool_param(stream, "stream"),
        exclude_input=bool_param(
            exclude if exclude is not None else False, "exclude_input_in_output"
        ),
    )


@dataclass
class _Job:
    request: InferRequest
    params: GenerateParams
    send: Sender
    generated: list[str] = field(default_factory=list)


@dataclass
class EngineStats:
    """What the engine publishes as vLLM's metrics (read under the engine's lock)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    steps: int = 0


class _Engine:
    """The engine thread: admits requests, steps the scheduler, sends tokens."""

    def __init__(self, backend: GenerativeBackend, limits: EngineLimits, seed: int) -> None:
        self._backend = backend
        self.limits = limits
        self._rng = np.random.default_rng(seed)
        self._cond = threading.Condition()
        self._inbox: list[_Job] = []
        self._jobs: dict[str, _Job] = {}
        self._state = EngineState.empty(limits)
        self._stopping = False
        self._next_id = 0
        self.stats = EngineStats()
        self._thread = threading.Thread(target=self._run, name="generative-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, drain_s: float = 30.0) -> None:
        """Finish the requests under way (at most ``drain_s``), then end the thread; requests
        still unfinished then are answered UNAVAILABLE."""
        with self._cond:
            self._cond.wait_for(lambda: not self._jobs and not self._inbox, timeout=drain_s)
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, job: _Job) -> None:
        with self._cond:
            if self._stopping:
                raise ServerError("the engine is stopping", Code.UNAVAILABLE)
            self._inbox.append(job)
            self._cond.notify_all()

    def snapshot(self) -> EngineStats:
        with self._cond:
            stats = EngineStats(
                **{f.name: getattr(self.stats, f.name) for f in fields(EngineStats)}
            )
            stats.finished = dict(stats.finished)
            return stats

    def _admit(self) -> list[_Job]:
        """Under the lock: queue new jobs, drop cancelled ones (returned to answer)."""
        for job in self._inbox:
            seq_id = str(self._next_id)
            self._next_id += 1
            self._jobs[seq_id] = job
            self._state = self._state.add(
                Seq(seq_id, job.params.prompt_tokens, job.params.max_tokens)
            )
        self._inbox.clear()
        gone = frozenset(k for k, j in self._jobs.items() if j.request.cancelled)
        if not gone:
            return []
        self._state, _ = abort(self._state, gone)
        self._cond.notify_all()  # a draining stop waits for the last job
        return [self._jobs.pop(k) for k in gone]

    def _run(self) -> None:
        last_end: int | None = None  # when the previous step ended, if the engine kept busy
        while True:
            with self._cond:
                while not self._stopping and not self._inbox and self._state.idle:
                    self._publish()
                    last_end = None
                    self._cond.wait()
                if self._stopping:
                    cancelled = [*self._jobs.values(), *self._inbox]
                    self._jobs.clear()
                    self._inbox.clear()
                    break
                cancelled = self._admit()
                step = decide_step(self.limits, self._state)
                self._state = step.state
                self.stats.preemptions += len(step.preempted)
                self.stats.prompt_tokens += step.prefill_tokens
                self.stats.steps += 1
                self._publish()
            for job in cancelled:
                job.send(ServerError("Request was cancelled", Code.CANCELLED), True)
            if step.empty:
                last_end = None
                with self._cond:
                    self._cond.wait(0.01)
                continue
            last_end = self._backend.run_step(step.prefill_tokens, step.decode_seqs, last_end)
            with self._cond:
                scheduled = {s.id for s in step.scheduled}
                eos = frozenset(
                    s.id
                    for s in step.state.running
                    if s.id in scheduled
                    and s.computed == s.num_tokens  # it samples in this step
                    and s.id in self._jobs
                    and self._draws_eos(self._jobs[s.id], s.generated + 1)
                )
                done = complete_step(step, eos)
                self._state = done.state
                self.stats.generation_tokens += len(done.sampled)
                emitted = [(self._jobs[i], i) for i in done.sampled if i in self._jobs]
                finished = {s.id for s in done.finished}
                if done.finished:
                    self._cond.notify_all()  # a draining stop waits for the last job
                for seq in done.finished:
                    self._jobs.pop(seq.id, None)
                    reason = "length" if seq.generated >= seq.max_tokens else "stop"
                    self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
                self._publish()
            for job, seq_id in emitted:
                self._backend.emit(job, final=seq_id in finished)
        for job in cancelled:
            job.send(ServerError("the model is unloading", Code.UNAVAILABLE), True)

    def _draws_eos(self, job: _Job, index: int) -> bool:
        if job.params.ignore_eos or index <= job.params.min_tokens:
            return False
        return bool(self._rng.random() < EOS_PROBABILITY)

    def _publish(self) -> None:
        state = self._state
        self.stats.running = len(state.running)
        self.stats.waiting = len(state.waiting) + len(self._inbox)
        self.stats.kv_cache_usage = state.used_blocks / self.limits.num_blocks


class GenerativeBackend:
    """Triton's vLLM backend played by an iteration-level scheduler on a simulated device."""

    def __init__(self) -> None:
        self._args: BackendArgs | None = None
        self.profile: LatencyProfile | None = None
        self.settings = EngineSettings()
        self._engine: _Engine | None = None
        self._rng = np.random.default_rng(0)

    def initialize(self, args: BackendArgs) -> None:
        cfg = args.config
        if not cfg.model_transaction_policy.decoupled:
            raise BackendError(
                "the vllm backend must be configured to use decoupled model transaction policy "
                "(model_transaction_policy { decoupled: true })",
                Code.INVALID_ARG,
            )
        if cfg.max_batch_size != 0 or cfg.HasField("dynamic_batching"):
            raise BackendError(
                "the vllm backend batches per iteration itself: set max_batch_size: 0 and "
                "remove dynamic_batching",
                Code.INVALID_ARG,
            )
        path = args.version_dir / ENGINE_FILE
        where = f"{args.model_name}/{args.model_version}/{ENGINE_FILE}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelConfigError(
                f"'{ENGINE_FILE}' containing vllm engine args must be provided in "
                f"'{args.model_name}/{args.model_version}'"
            ) from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"cannot read {where}: {exc}") from exc
        self.settings = EngineSettings.from_json(data, where)
        ref = args.parameters.get("profile", "tinyllm_sim") or "tinyllm_sim"
        self.profile = resolve_profile(ref, args.version_dir.parent)
        if self.profile.step is None:
            raise ModelConfigError(
                f"latency profile '{self.profile.name}' has no [step] table: a generative model "
                "needs a step-time profile (see tinyllm_sim)"
            )
        limits = EngineLimits(
            max_num_seqs=self.settings.max_num_seqs,
            max_num_batched_tokens=self.settings.max_num_batched_tokens,
            enable_chunked_prefill=self.settings.enable_chunked_prefill,
            num_blocks=kv_cache_blocks(self.settings, self.profile),
            block_size=self.settings.block_size,
        )
        self._args = args
        self._rng = np.random.default_rng(self.profile.seed + args.instance_index)
        meter = args.device.meter
        meter.attach(self.profile.gpu)
        if self.profile.gpu is not None:
            # vLLM takes its whole memory share at start-up: weights plus the KV cache.
            gpu = self.profile.gpu
            meter.hold(self, int(gpu.memory_total_mb * self.settings.gpu_memory_utilization * _MIB))
        self._engine = _Engine(self, limits, self.profile.seed + 1000 + args.instance_index)
        self._engine.start()

    @property
    def limits(self) -> EngineLimits:
        assert self._engine is not None
        return self._engine.limits

    def engine_figures(self) -> tuple[EngineStats, int] | None:
        """The engine's figures for vLLM's metrics and its KV blocks (None when it is down)."""
        engine = self._engine
        if engine is None:
            return None
        return engine.snapshot(), engine.limits.num_blocks

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServerError | None]:
        """Hand each request to the engine; the answers come through its response sender."""
        assert self._engine is not None
        results: list[InferResponse | ServerError | None] = []
        for request in requests:
            send = request.response_sender
            if send is None:
                results.append(
                    ServerError(
                        "a generative model answers through a stream: use ModelStreamInfer, "
                        "generate_stream or the OpenAI endpoints",
                        Code.UNSUPPORTED,
                    )
                )
                continue
            try:
                params = parse_request(request)
                reason = admissible(self._engine.limits, params.prompt_tokens, params.max_tokens)
                if reason is not None:
                    raise ServerError(reason, Code.INVALID_ARG)
                self._engine.submit(_Job(request, params, send))
            except ServerError as exc:
                results.append(exc)
                continue
            results.append(None)
        return results

    def run_step(self, prefill_tokens: int, decode_seqs: int, after_ns: int | None) -> int:
        """Spend one step's time on the simulated device; returns when the step ended.

        Args:
            after_ns: When the previous step ended, if this one follows it at once. The
                engine's own work since then (sending tokens, scheduling, a late wake-up) is
                part of the step's modelled time, as a real engine's host work is part of its
                fixed cost, so steps keep the profile's pace.
        """
        assert self._args is not None and self.profile is not None and self.profile.step
        ms = self.profile.step.ms(prefill_tokens, decode_seqs)
        if self.profile.jitter > 0:
            ms *= max(0.0, 1.0 + self.profile.jitter * float(self._rng.standard_normal()))
        duration_ns = int(ms * 1e6)
        if after_ns is not None:
            duration_ns = max(0, duration_ns - (time.monotonic_ns() - after_ns))
        _, end_ns = self._args.device.meter.book(duration_ns)
        delay = (end_ns - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        return end_ns

    def emit(self, job: _Job, final: bool) -> None:
        """Send a sampled token (streaming) or, at the end, the whole text."""
        assert self._args is not None
        text = token_text(len(job.generated))
        job.generated.append(text)
        if job.params.stream:
            job.send(self._response(job.request, text), final)
        elif final:
            body = "".join(job.generated)
            if not job.params.exclude_input:
                body = job.params.prompt + body
            job.send(self._response(job.request, body), True)

    def _response(self, request: InferRequest, text: str) -> InferResponse:
        assert self._args is not None
        resp = InferResponse(
            model_name=self._args.model_name, model_version=self._args.model_version, id=request.id
        )
        resp.outputs["text_output"] = np.array([text.encode("utf-8")], dtype=np.object_)
        resp.output_datatypes["text_output"] = "BYTES"
        return resp

    def finalize(self) -> None:
        if self._engine is not None:
            self._engine.stop()
            self._engine = None
        if self._args is not None:
            self._args.device.meter.release(self)
        self._args = None

    def device_info(self) -> dict[str, str]:
        assert self.profile is not None
        device = self._args.device.name if self._args is not None else ""
        info = {
            "backend": "vllm (reference engine)",
            "device": device,
            "profile": self.profile.name,
            "provenance": self.profile.provenance,
        }
        if self._engine is not None:
            info["kv_cache_blocks"] = str(self._engine.limits.num_blocks)
        return info
