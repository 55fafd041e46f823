"""A generative engine's profile: what one scheduler step costs, and how large its KV cache is.

The counterpart of :class:`~analyzer.predict.profile.Profile` for engines that batch per
iteration (vLLM, the reference engine). One step of such an engine costs ``fixed_ms +
prefill_ms_per_token * prompt tokens computed + decode_ms_per_seq * sequences decoding``
(:class:`reference_server.zoo.profiles.StepCost`, the reference engine's own formula), and its
KV cache holds a number of blocks that the memory share decides. :class:`EngineProfile` holds
both, the latency the engine does not see (network, protocol, detokenising: one constant added
to TTFT and end-to-end latency) and where the numbers come from.

Builders (all pure but for the file they read):

* :func:`engine_profile_from_toml`: a simulated-device profile with a ``[step]`` table
  (``reference_server/zoo/profiles``, the bundled ``tinyllm_sim``): exact costs, jitter and the
  memory formula (``[gpu]``, ``[kv]``) of the reference engine.
* :func:`fit_steps`: a least-squares fit of a live probe's samples
  (:mod:`analyzer.predict.engine_probe`): lone requests of two prompt lengths time the prefill,
  ``k`` concurrent decoding requests the step's fixed part and its per-sequence part.

The KV cache: with the ``[gpu]``/``[kv]`` memory (:class:`KvMemory`), the blocks of any
``gpu_memory_utilization`` and ``block_size`` follow vLLM's rule
(:func:`reference_server.backends.generative.kv_cache_blocks`). A probed engine reports only its
cache's size at the share it runs with (``vllm:num_kv_cache_blocks_total``, or vLLM's
``vllm:cache_config_info``): the profile then covers that share alone (any block size: the
cache's tokens are what it holds), and configs of other shares are not predicted
(:meth:`EngineProfile.covers`). Without either, the cache is taken to be unbounded and the
provenance says so.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.predict import ProfileError
from reference_server.batching.iteration import EngineLimits
from reference_server.zoo.profiles import StepCost

__all__ = [
    "DecodeSample",
    "EngineConfig",
    "EngineProfile",
    "KvMemory",
    "PrefillSample",
    "engine_profile_from_toml",
    "fit_steps",
    "kv_blocks_from_metrics",
    "load_engine_profile",
    "save_engine_profile",
]

#: Blocks of an unbounded cache (no memory figure known): more than any load can fill.
UNBOUNDED_BLOCKS = 1 << 30

#: Two memory shares closer than this are the same share.
SHARE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class EngineConfig:
    """The engine settings a simulated config runs with (vLLM's names and defaults).

    Attributes:
        max_num_seqs: Most sequences running at once.
        max_num_batched_tokens: Most tokens one step carries.
        enable_chunked_prefill: Prefill a long prompt over several steps.
        gpu_memory_utilization: Share of the device memory for weights and KV cache.
        block_size: Tokens per KV-cache block.
        instance_count: Engines serving the model (the simulator models one).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    instance_count: int = 1

    def describe(self) -> str:
        """One line, as the console prints it."""
        chunked = "on" if self.enable_chunked_prefill else "off"
        return (
            f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens "
            f"{self.max_num_batched_tokens}, chunked prefill {chunked}, gpu_memory_utilization "
            f"{self.gpu_memory_utilization:g}"
            + (f", {self.instance_count} instances" if self.instance_count != 1 else "")
        )

    @classmethod
    def from_settings(cls, settings: dict[str, Any], instance_count: int = 1) -> EngineConfig:
        """From engine arguments by vLLM's names (``model.json``, read as the reference engine
        reads it: ``"8"`` and ``"true"`` included; other keys are ignored).

        Raises:
            ProfileError: a modelled key has a wrong type or value.
        """
        from reference_server.backends.generative import EngineSettings
        from reference_server.core.errors import ModelConfigError

        try:
            read = EngineSettings.from_json(settings, "model.json")
        except ModelConfigError as exc:
            raise ProfileError(str(exc)) from exc
        return cls(
            max_num_seqs=read.max_num_seqs,
            max_num_batched_tokens=read.max_num_batched_tokens,
            enable_chunked_prefill=read.enable_chunked_prefill,
            gpu_memory_utilization=read.gpu_memory_utilization,
            block_size=read.block_size,
            instance_count=instance_count,
        )


@dataclass(frozen=True)
class KvMemory:
    """The device memory the KV cache shares (the reference engine's ``[gpu]`` and ``[kv]``).

    Attributes:
        memory_total_mb: Device memory, MiB.
        reserved_mb: What the engine holds besides the cache (weights and context), MiB.
        bytes_per_token: KV bytes one token takes.
    """

    memory_total_mb: float
    reserved_mb: float
    bytes_per_token: float

    def blocks(self, gpu_memory_utilization: float, block_size: int) -> int:
        """Blocks the share leaves after the reserved memory (vLLM's rule; may be <= 0)."""
        from reference_server.backends.generative import EngineSettings, kv_cache_blocks
        from reference_server.core.errors import ModelConfigError
        from reference_server.core.gpu import SimulatedGpuSpec
        from reference_server.zoo.profiles import KvCacheSpec, LatencyCurve, LatencyProfile

        device = LatencyProfile(
            "engine",
            "",
            LatencyCurve(),
            gpu=SimulatedGpuSpec(memory_total_mb=self.memory_total_mb, weights_mb=self.reserved_mb),
            kv=KvCacheSpec(self.bytes_per_token),
        )
        settings = EngineSettings(
            gpu_memory_utilization=gpu_memory_utilization, block_size=block_size
        )
        try:
            return kv_cache_blocks(settings, device)
        except ModelConfigError:
            return 0


@dataclass(frozen=True)
class EngineProfile:
    """What the engine simulator needs of an engine.

    Attributes:
        model: The model profiled.
        cost: One step's cost.
        jitter: Relative standard deviation of a step's time.
        latency_offset_ms: Added to every request's TTFT and end-to-end latency: what the
            engine does not see (network, protocol, the client).
        itl_tail_ms: Added to the ITL p99: how much later than the engine's steps a client
            sees its slowest gaps (its own scheduling, the network), calibrated on measured
            operating points.
        memory: The memory the cache shares (blocks at any share), when known.
        kv_blocks: ``(gpu_memory_utilization, blocks, block_size)`` the engine reported at the
            one share it ran with (used when :attr:`memory` is unknown).
        probed_seqs: Most concurrent sequences the decode cost was measured at (0: not probed).
        source: ``probe``, ``toml:<name>`` or ``file``.
        provenance: Where the numbers come from, in words.
    """

    model: str
    cost: StepCost
    jitter: float = 0.0
    latency_offset_ms: float = 0.0
    itl_tail_ms: float = 0.0
    memory: KvMemory | None = None
    kv_blocks: tuple[float, int, int] | None = None
    probed_seqs: int = 0
    source: str = "file"
    provenance: str = ""

    def covers(self, config: EngineConfig) -> bool:
        """Whether ``config`` can be simulated: one engine, and its cache size known."""
        if config.instance_count != 1:
            return False
        if self.memory is None and self.kv_blocks is not None:
            share = self.kv_blocks[0]
            return abs(config.gpu_memory_utilization - share) <= SHARE_TOLERANCE
        return True

    def coverage(self) -> str:
        """What :meth:`covers` accepts, in words."""
        if self.memory is None and self.kv_blocks is not None:
            return f"one engine at gpu_memory_utilization {self.kv_blocks[0]:g}"
        return "one engine at any gpu_memory_utilization"

    def num_blocks(self, config: EngineConfig) -> int:
        """KV-cache blocks of ``config`` (0: its share leaves no room for a cache)."""
        if self.memory is not None:
            return self.memory.blocks(config.gpu_memory_utilization, config.block_size)
        if self.kv_blocks is not None:
            _, blocks, size = self.kv_blocks
            return (blocks * size) // config.block_size
        return UNBOUNDED_BLOCKS

    def limits(self, config: EngineConfig) -> EngineLimits:
        """The scheduler's limits under ``config``.

        Raises:
            ProfileError: the share leaves no room for a KV cache.
        """
        blocks = self.num_blocks(config)
        if blocks < 1:
            raise ProfileError(
                f"{config.describe()}: the memory share leaves no room for the KV cache"
            )
        return EngineLimits(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
            num_blocks=blocks,
            block_size=config.block_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (:func:`save_engine_profile`)."""
        return {
            "model": self.model,
            "step": {
                "fixed_ms": self.cost.fixed_ms,
                "prefill_ms_per_token": self.cost.prefill_ms_per_token,
                "decode_ms_per_seq": self.cost.decode_ms_per_seq,
            },
            "jitter": self.jitter,
            "latency_offset_ms": self.latency_offset_ms,
            "itl_tail_ms": self.itl_tail_ms,
            "memory": None
            if self.memory is None
            else {
                "memory_total_mb": self.memory.memory_total_mb,
                "reserved_mb": self.memory.reserved_mb,
                "bytes_per_token": self.memory.bytes_per_token,
            },
            "kv_blocks": list(self.kv_blocks) if self.kv_blocks is not None else None,
            "probed_seqs": self.probed_seqs,
            "source": self.source,
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineProfile:
        """Inverse of :meth:`to_dict`.

        Raises:
            ProfileError: a field is missing or of the wrong type.
        """
        try:
            step = data["step"]
            memory = data.get("memory")
            kv = data.get("kv_blocks")
            return cls(
                model=str(data["model"]),
                cost=StepCost(
                    float(step["fixed_ms"]),
                    float(step["prefill_ms_per_token"]),
                    float(step["decode_ms_per_seq"]),
                ),
                jitter=float(data.get("jitter", 0.0)),
                latency_offset_ms=float(data.get("latency_offset_ms", 0.0)),
                itl_tail_ms=float(data.get("itl_tail_ms", 0.0)),
                memory=None
                if memory is None
                else KvMemory(
                    float(memory["memory_total_mb"]),
                    float(memory["reserved_mb"]),
                    float(memory["bytes_per_token"]),
                ),
                kv_blocks=None if kv is None else (float(kv[0]), int(kv[1]), int(kv[2])),
                probed_seqs=int(data.get("probed_seqs", 0)),
                source=str(data.get("source", "file")),
                provenance=str(data.get("provenance", "")),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ProfileError(f"not an engine profile: {exc!r}") from exc


def save_engine_profile(profile: EngineProfile, path: Path) -> None:
    """Write ``profile`` as JSON (``{"engine": ...}``, which :func:`load_engine_profile` reads)."""
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"engine": profile.to_dict()}, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_engine_profile(path: Path) -> EngineProfile:
    """Read what :func:`save_engine_profile` wrote.

    Raises:
        ProfileError: unreadable, or not an engine profile.
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"cannot read engine profile {path}: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("engine"), dict):
        raise ProfileError(f"{path} is not an engine profile (no 'engine' object)")
    return EngineProfile.from_dict(doc["engine"])


def engine_profile_from_toml(ref: str, model: str, model_dir: Path | None = None) -> EngineProfile:
    """The profile of a simulated generative device (a ``[step]`` TOML, e.g. ``tinyllm_sim``).

    Raises:
        ProfileError: the profile cannot be read or has no ``[step]`` table.
    """
    from reference_server.core.errors import ModelConfigError
    from reference_server.zoo.profiles import resolve_profile

    try:
        device = resolve_profile(ref, model_dir)
    except ModelConfigError as exc:
        raise ProfileError(str(exc)) from exc
    if device.step is None:
        raise ProfileError(f"latency profile {ref!r} has no [step] table: not a generative engine")
    memory = None
    if device.gpu is not None and device.kv is not None:
        gpu = device.gpu
        memory = KvMemory(
            gpu.memory_total_mb, gpu.weights_mb + gpu.context_mb, device.kv.bytes_per_token
        )
    return EngineProfile(
        model=model,
        cost=device.step,
        jitter=device.jitter,
        memory=memory,
        source=f"toml:{device.name}",
        provenance=device.provenance,
    )


@dataclass(frozen=True)
class PrefillSample:
    """A lone request: its prompt length and the time to its first token, ms."""

    prompt_tokens: int
    ttft_ms: float


@dataclass(frozen=True)
class DecodeSample:
    """``seqs`` requests decoding together: the time between two of their tokens, ms."""

    seqs: int
    itl_ms: float


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` of ``y = a + b x``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        raise ProfileError("the probe needs samples at two or more sizes to fit a line")
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def fit_steps(
    model: str,
    prefill: Sequence[PrefillSample],
    decode: Sequence[DecodeSample],
    *,
    jitter: float = 0.0,
    kv_blocks: tuple[float, int, int] | None = None,
    provenance: str = "",
) -> EngineProfile:
    """The step costs that explain a probe's samples.

    A decode step of ``k`` sequences lasts ``fixed + decode * k``: a line through the decode
    samples gives both (the median at each ``k``, so a hiccup does not tilt it). A lone
    request's first token comes after one prefill step, ``fixed + prefill * prompt``, plus what
    the engine does not see: the line through the prefill samples gives ``prefill`` as its slope,
    and its intercept less ``fixed`` is the latency offset. Negative fits (noise around a cost
    of nothing) are clipped at 0.

    Raises:
        ProfileError: fewer than two decode sizes or two prompt lengths.
    """
    by_seqs: dict[int, list[float]] = {}
    for d in decode:
        by_seqs.setdefault(d.seqs, []).append(d.itl_ms)
    by_prompt: dict[int, list[float]] = {}
    for p in prefill:
        by_prompt.setdefault(p.prompt_tokens, []).append(p.ttft_ms)
    if len(by_seqs) < 2:
        raise ProfileError("the probe timed decoding at fewer than two concurrencies")
    if len(by_prompt) < 2:
        raise ProfileError("the probe timed prefill at fewer than two prompt lengths")
    fixed, per_seq = _line([(k, statistics.median(v)) for k, v in sorted(by_seqs.items())])
    base, per_token = _line([(p, statistics.median(v)) for p, v in sorted(by_prompt.items())])
    fixed, per_seq, per_token = max(fixed, 0.0), max(per_seq, 0.0), max(per_token, 0.0)
    offset = max(base - fixed, 0.0)
    return EngineProfile(
        model=model,
        cost=StepCost(round(fixed, 4), round(per_token, 6), round(per_seq, 5)),
        jitter=round(max(jitter, 0.0), 4),
        latency_offset_ms=round(offset, 3),
        kv_blocks=kv_blocks,
        probed_seqs=max(by_seqs),
        source="probe",
        provenance=provenance,
    )


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<v>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def kv_blocks_from_metrics(text: str) -> tuple[float, int, int] | None:
    """``(gpu_memory_utilization, blocks, block_size)`` from an engine's Prometheus text: vLLM's
    ``vllm:cache_config_info`` labels (``num_gpu_blocks``, ``block_size``,
    ``gpu_memory_utilization``), or the reference engine's ``vllm:num_kv_cache_blocks_total``
    with the share and block size left to the caller (None when neither is there)."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group("name") != "vllm:cache_config_info":
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        try:
            blocks = int(float(labels["num_gpu_blocks"]))
            size = int(float(labels.get("block_size", "16")))
            share = float(labels.get("gpu_memory_utilization", "nan"))
        except (KeyError, ValueError):
            continue
        if blocks > 0 and size > 0:
            return share, blocks, size
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is not None and m.group("name") == "vllm:num_kv_cache_blocks_total":
            try:
                blocks = int(float(m.group("v")))
            except ValueError:
                continue
            if blocks > 0:
                return math.nan, blocks, 0
    return None


def with_share(
    kv: tuple[float, int, int] | None, config: EngineConfig
) -> tuple[float, int, int] | None:
    """A metrics reading completed with what the engine runs with (``config``) where the
    engine did not say."""
    if kv is None:
        return None
    share, blocks, size = kv
    return (
        config.gpu_memory_utilization if math.isnan(share) else share,
        blocks,
        size or config.block_size,
    )


def rescaled_costs(profile: EngineProfile, factor: float) -> EngineProfile:
    """``profile`` with every step cost scaled by ``factor`` (a run's measurements say the engine
    is that much slower or faster than probed)."""
    c = profile.cost
    return replace(
        profile,
        cost=StepCost(
            c.fixed_ms * factor, c.prefill_ms_per_token * factor, c.decode_ms_per_seq * factor
        ),
    )
