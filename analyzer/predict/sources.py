"""Profiles from a file: a statistics-extension document (:func:`from_statistics`: its
``batch_stats`` give ns and count per batch size) or a simulated-device profile TOML
(:func:`from_toml`: the simulated backend's exact curves). Pure except for the read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analyzer.predict import ProfileError
from analyzer.predict.profile import BatchTiming, Profile

# ------------------------------------------------------------------ from a statistics document


def from_statistics(
    doc: Mapping[str, Any],
    model: str,
    *,
    instances: int = 1,
    server: str = "server",
    jitter: float = 0.0,
) -> Profile:
    """Build a profile from a statistics-extension document's ``batch_stats``.

    Args:
        doc: ``{"model_stats": [...]}`` (HTTP JSON, or tritonclient.grpc's ``as_json``).
        model: Model name (all its versions are summed).
        instances: Instance count the statistics were taken with.
        server: How the provenance names the server (e.g. its URL and version).
        jitter: Relative standard deviation to assume (statistics carry only means).

    Raises:
        ProfileError: the document has no executions of ``model``.
    """
    sums: dict[int, list[int]] = {}  # size -> [count, input ns, infer ns, output ns]
    for entry in doc.get("model_stats", []):
        if entry.get("name") != model:
            continue
        for b in entry.get("batch_stats", []):
            size = int(b.get("batch_size", 0))
            count = int(b.get("compute_infer", {}).get("count", 0))
            if size < 1 or count < 1:
                continue
            acc = sums.setdefault(size, [0, 0, 0, 0])
            acc[0] += count
            for i, key in enumerate(("compute_input", "compute_infer", "compute_output"), 1):
                acc[i] += int(b.get(key, {}).get("ns", 0))
    if not sums:
        raise ProfileError(
            f"the statistics have no executions of model {model!r} per batch size: send it "
            "traffic first (batch_stats fill as batches execute)"
        )
    timings = tuple(
        BatchTiming(size, i / n / 1e6, f / n / 1e6, o / n / 1e6, n)
        for size, (n, i, f, o) in sorted(sums.items())
    )
    total = sum(t.executions for t in timings)
    return Profile(
        model=model,
        provenance=(
            f"measured: batch_stats of {server} ({total} executions, {instances} instance(s)); "
            "means per batch size, compute_infer taken as the device part"
        ),
        source="statistics",
        timings=timings,
        jitter=jitter,
        instances_profiled=instances,
    )


# ------------------------------------------------------------------ from a simulated-device TOML


def from_toml(ref: str | Path, *, max_batch_size: int | None = None, model: str = "") -> Profile:
    """The simulated backend's own curves (bundled name or path), sampled at every size.

    Args:
        ref: Bundled profile name (``resnet50_sim``) or a path to a profile TOML.
        max_batch_size: Largest size to cover (default: the last table point; required for a
            linear ``a_ms + b_ms * batch`` profile without a table).
        model: Model name to record (default: the profile's name).
    """
    from reference_server.core.errors import ModelConfigError
    from reference_server.zoo.profiles import resolve_profile

    try:
        lat = resolve_profile(str(ref))
    except ModelConfigError as exc:
        raise ProfileError(str(exc)) from exc
    if max_batch_size is None:
        ends = [int(c.points[-1][0]) for c in (lat.device, lat.host_pre, lat.host_post) if c.points]
        if not ends:
            raise ProfileError(
                f"profile {lat.name} is linear (no table): give max_batch_size to bound it"
            )
        max_batch_size = max(ends)
    timings = tuple(
        BatchTiming(b, lat.host_pre.ms(b), lat.device.ms(b), lat.host_post.ms(b))
        for b in range(1, max_batch_size + 1)
    )
    return Profile(
        model=model or lat.name,
        provenance=f"simulated-device profile {lat.name}: {' '.join(lat.provenance.split())}",
        source="toml",
        timings=timings,
        jitter=lat.jitter,
    )
