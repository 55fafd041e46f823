"""``perfsweep gate`` reads GPU figures too: which ``/metrics`` each target's engine is given."""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.gate.measuring import metrics_url_for
from analyzer.gate.plan import MeasureRequest


@dataclass
class Remote:
    url: str


@dataclass
class Managed:
    url: str
    metrics_url: str


def test_managed_server_uses_its_own_metrics_port() -> None:
    target = Managed("http://127.0.0.1:8000", "http://127.0.0.1:8002/metrics")
    given = {"http://127.0.0.1:8000": "http://elsewhere/metrics"}
    assert metrics_url_for(target, given) == "http://127.0.0.1:8002/metrics"  # type: ignore[arg-type]


def test_remote_candidate_gets_the_given_url_and_the_baseline_does_not() -> None:
    given = {"http://10.0.0.1:8000": "http://10.0.0.1:8002/metrics"}
    assert metrics_url_for(Remote("http://10.0.0.1:8000"), given) == given["http://10.0.0.1:8000"]  # type: ignore[arg-type]
    assert metrics_url_for(Remote("http://10.0.0.2:8000"), given) is None  # type: ignore[arg-type]


def test_metrics_url_is_a_live_flag() -> None:
    assert "--metrics-url" in MeasureRequest(metrics_url="http://x/metrics").live_flags()
