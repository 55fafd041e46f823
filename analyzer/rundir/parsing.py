"""What every record's ``from_dict`` shares: optional fields, knobs, migration, clear refusals.

``migrate`` lifts an older version of a kind through :data:`analyzer.documents.FORMATS`;
``parse_guarded`` turns a damaged file (a key missing, a value of the wrong type) into a
:class:`~analyzer.errors.ResultFormatError` that says what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from analyzer.config.pipeline import TrialKnobs, knobs_from_dict
from analyzer.documents import FORMATS
from analyzer.errors import ResultFormatError

#: The per-GPU figures a summary entry keeps (``measure.GpuStats`` less its samples).
GPU_FIGURE_KEYS = (
    "uuid",
    "name",
    "utilization_pct_mean",
    "utilization_pct_p95",
    "memory_used_peak_mb",
    "memory_total_mb",
    "power_mean_w",
    "power_limit_w",
)


def parse_knobs(data: Mapping[str, Any]) -> TrialKnobs:
    """One model's knobs, or a pipeline's (``{"stages": {...}}``)."""
    return knobs_from_dict(data)


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def migrate(kind: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` lifted to the current version of ``kind`` (a dict without header: current).

    Raises:
        ResultFormatError: A version newer than this perfsweep's, or one it has no path from.
    """
    if "format_version" not in data:  # from_dict takes header-less dicts: the current version
        return data
    return FORMATS[kind].lift(data, data.get("kind", kind))


def parse_guarded(kind: str, parse: Callable[[], Any]) -> Any:
    """Run ``parse``; a missing key or a value of the wrong type is a damaged ``kind`` file."""
    try:
        return parse()
    except ResultFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ResultFormatError(
            f"a {kind} record is damaged ({what}); re-run the sweep, or use the perfsweep "
            "version that wrote it"
        ) from exc
