"""Latency profiles of simulated devices, read from TOML.

A profile gives, as functions of the batch size, the device time of one execution (serialised
on the device) and the host time before and after it (overlapping across instances). Each curve
is either a piecewise-linear ``table = [[batch, ms], ...]`` or ``a_ms + b_ms * batch``. Every
profile states its ``provenance``; a synthetic one says it is synthetic.

An optional ``[gpu]`` table gives what the simulated GPU reports on ``/metrics`` besides its
busy share: memory (total, context, weights and activations per instance) and power
(:class:`~reference_server.core.gpu.SimulatedGpuSpec`), with a ``provenance`` of its own.

A generative engine's profile (:mod:`reference_server.backends.generative`) has a ``[step]``
table instead of ``[device]``: the time of one engine step, ``fixed_ms + prefill_ms_per_token *
prefill tokens + decode_ms_per_seq * decoding sequences`` (:class:`StepCost`), and a ``[kv]``
table with the KV-cache bytes one token takes (:class:`KvCacheSpec`); its ``[gpu]`` table gives
the device memory and the weights that the KV cache shares it with.
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from reference_server.core.errors import ModelConfigError
from reference_server.core.gpu import SimulatedGpuSpec

PROFILE_DIR = Path(__file__).with_name("profiles")


@dataclass(frozen=True)
class LatencyCurve:
    """Milliseconds per execution as a function of batch size.

    Attributes:
        points: Sorted ``(batch, ms)`` pairs (piecewise linear), or empty.
        a_ms: Constant part of the linear form.
        b_ms: Per-item part of the linear form.
    """

    points: tuple[tuple[float, float], ...] = ()
    a_ms: float = 0.0
    b_ms: float = 0.0

    def ms(self, batch_size: int) -> float:
        """Duration in ms for a batch of ``batch_size``."""
        if not self.points:
            return max(0.0, self.a_ms + self.b_ms * batch_size)
        xs = [p[0] for p in self.points]
        if len(self.points) == 1:
            return self.points[0][1]
        i = bisect.bisect_left(xs, batch_size)
        i = min(max(i, 1), len(xs) - 1)
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return max(0.0, y0 + (y1 - y0) * (batch_size - x0) / (x1 - x0))

    @classmethod
    def from_toml(cls, data: dict[str, Any] | None, where: str) -> LatencyCurve:
        if not data:
            return cls()
        if "table" in data:
            try:
                points = tuple(sorted((float(b), float(ms)) for b, ms in data["table"]))
            except (TypeError, ValueError) as exc:
                raise ModelConfigError(f"{where}: 'table' must be [[batch, ms], ...]") from exc
            if not points:
                raise ModelConfigError(f"{where}: 'table' is empty")
            return cls(points=points)
        return cls(a_ms=float(data.get("a_ms", 0.0)), b_ms=float(data.get("b_ms", 0.0)))


@dataclass(frozen=True)
class StepCost:
    """Milliseconds of one step of a generative engine.

    Attributes:
        fixed_ms: Every step (kernel launches, sampling, scheduling).
        prefill_ms_per_token: Per prompt token computed in the step (prefill and recompute).
        decode_ms_per_seq: Per sequence decoding one token in the step (its KV reads).
    """

    fixed_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    decode_ms_per_seq: float = 0.0

    def ms(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Noise-free duration of a step carrying these tokens (0 for an empty step)."""
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        return (
            self.fixed_ms
            + self.prefill_ms_per_token * prefill_tokens
            + self.decode_ms_per_seq * decode_seqs
        )

    @classmethod
    def from_toml(cls, data: Any, where: str) -> StepCost:
        if not isinstance(data, dict):
            raise ModelConfigError(f"{where}: [step] must be a table")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ModelConfigError(
                f"{where} [step]: unknown keys {unknown}; known: {sorted(cls.__dataclass_fields__)}"
            )
        try:
            cost = cls(**{k: float(v) for k, v in data.items()})
        except (TypeError, ValueError) as exc:
            raise ModelConfigError(f"{where} [step]: values must be numbers") from exc
        if min(cost.fixed_ms, cost.prefill_ms_per_token, cost.decode_ms_per_seq) < 0:
            raise ModelConfigError(f"{where} [step]: times must not be negative")
        return cost


@dataclass(frozen=True)
class KvCacheSpec:
    """The KV cache of a simulated generative model.

    Attributes:
        bytes_per_token: KV bytes one token takes over all layers (``2 * layers * kv_heads *
            head_dim * dtype bytes``).
    """

    bytes_per_token: float

    @classmethod
    def from_toml(cls, data: Any, where: str) -> KvCacheSpec:
        try:
            value = float(data["bytes_per_token"])
        except (TypeError, KeyError, ValueError) as exc:
            raise ModelConfigError(f"{where} [kv]: needs a number 'bytes_per_token'") from exc
        if value <= 0:
            raise ModelConfigError(f"{where} [kv]: bytes_per_token must be positive")
        return cls(value)


@dataclass(frozen=True)
class LatencyProfile:
    """A simulated device.

    Attributes:
        name: Profile name.
        provenance: Where the numbers come from.
        device: Device time (serialised across instances sharing the device).
        host_pre: Host time before the device part.
        host_post: Host time after it.
        jitter: Relative standard deviation applied to every duration.
        seed: RNG seed (each instance adds its index).
        gpu: Memory and power of the simulated GPU (None: it reports utilisation only).
        gpu_provenance: Where the ``[gpu]`` figures come from.
        step: A generative engine's step time (None for other models).
        kv: A generative engine's KV cache (None for other models).
    """

    name: str
    provenance: str
    device: LatencyCurve
    host_pre: LatencyCurve = LatencyCurve()
    host_post: LatencyCurve = LatencyCurve()
    jitter: float = 0.0
    seed: int = 0
    gpu: SimulatedGpuSpec | None = None
    gpu_provenance: str = ""
    step: StepCost | None = None
    kv: KvCacheSpec | None = None

    def throughput_per_s(self, batch_size: int, instances: int = 1) -> float:
        """Noise-free peak inferences per second at a fixed batch size.

        The device is the bottleneck unless host time per instance is larger: with ``n``
        instances, executions overlap host work, so the cycle is
        ``max(device, (pre + device + post) / n)``.
        """
        dev = self.device.ms(batch_size)
        total = self.host_pre.ms(batch_size) + dev + self.host_post.ms(batch_size)
        cycle_ms = max(dev, total / max(1, instances))
        return 1000.0 * batch_size / cycle_ms if cycle_ms > 0 else float("inf")


def load_profile(path: Path, shown: str | None = None) -> LatencyProfile:
    """Read a profile TOML file.

    Args:
        path: The file.
        shown: How messages name it (default: ``path``); the server passes the path relative to
            the model directory so that no absolute path reaches a client.

    Raises:
        ModelConfigError: unreadable file or missing ``device`` / ``provenance``.
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc
        raise ModelConfigError(f"cannot read latency profile {shown or path}: {reason}") from exc
    if ("device" not in data and "step" not in data) or not data.get("provenance"):
        raise ModelConfigError(
            f"latency profile {shown or path} needs a [device] (or, for a generative engine, "
            "[step]) table and a 'provenance' string"
        )
    label = shown or path
    gpu, gpu_provenance = _gpu_table(data.get("gpu"), label)
    step = StepCost.from_toml(data["step"], str(label)) if "step" in data else None
    kv = KvCacheSpec.from_toml(data.get("kv"), str(label)) if "step" in data else None
    return LatencyProfile(
        name=str(data.get("name", Path(path).stem)),
        provenance=str(data["provenance"]),
        device=LatencyCurve.from_toml(data.get("device"), f"{label} [device]"),
        step=step,
        kv=kv,
        host_pre=LatencyCurve.from_toml(data.get("host_pre"), f"{label} [host_pre]"),
        host_post=LatencyCurve.from_toml(data.get("host_post"), f"{label} [host_post]"),
        jitter=float(data.get("jitter", 0.0)),
        seed=int(data.get("seed", 0)),
        gpu=gpu,
        gpu_provenance=gpu_provenance,
    )


def _gpu_table(data: Any, label: object) -> tuple[SimulatedGpuSpec | None, str]:
    if data is None:
        return None, ""
    if not isinstance(data, dict) or not data.get("provenance"):
        raise ModelConfigError(f"latency profile {label}: [gpu] needs a 'provenance' string")
    fields = {k: v for k, v in data.items() if k != "provenance"}
    try:
        return SimulatedGpuSpec.from_toml(fields), str(data["provenance"])
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"latency profile {label} [gpu]: {exc}") from exc


def bundled_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def resolve_profile(ref: str, model_dir: Path | None = None) -> LatencyProfile:
    """Load a profile by bundled name, or by path.

    With ``model_dir`` (a served model) the path must lie inside the model directory: a config
    override may name any path, and the server must not read files outside its repository.
    Without it (library use) any path is taken as given.
    """
    if ref in bundled_profiles():
        return load_profile(PROFILE_DIR / f"{ref}.toml")
    path = Path(ref)
    if model_dir is not None:
        from reference_server.core.repository import inside

        path = inside(model_dir, ref, "latency profile", resolve_links=False)
    if not path.is_file():
        raise ModelConfigError(
            f"latency profile '{ref}' not found: give a bundled name "
            f"({', '.join(bundled_profiles())}) or a path to a .toml file"
            + (" inside the model directory" if model_dir is not None else "")
        )
    return load_profile(path, shown=ref)
