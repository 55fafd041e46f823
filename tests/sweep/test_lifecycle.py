"""The sweep's lifecycle against the planted model: what is written when, what is left on the
server, what is refused before anything is loaded, and how an interrupted trial is recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analyzer.config.model_config import knobs_of
from analyzer.config.scenario import load_scenario
from analyzer.errors import InputError, TargetDiedError, TargetError
from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from analyzer.search.study import INTERRUPTED_REASON
from analyzer.sweep.loop import run_sweep
from analyzer.target.remote import RemoteTarget, http_url
from tests.sweep.planted import FakeLoadGenerator, FakeTarget
from tests.sweep.test_sweep_fake import (
    CPU_LIKE,
    InterruptingGenerator,
    PlantedCapacities,
    scenario,
)


def report_data(run_dir: Path) -> dict[str, Any]:
    text = (run_dir / "report.html").read_text()
    start = text.index('id="perfsweep-data">') + len('id="perfsweep-data">')
    data: dict[str, Any] = json.loads(text[start : text.index("</script>", start)])
    return data


@pytest.mark.usefixtures("takes_seconds")
def test_a_completed_run_is_completed_in_its_report(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 3, "budget.validate_top": 0, "run.report": True})
    target = FakeTarget()
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    assert json.loads((summary.run_dir / "run.json").read_text())["status"] == "completed"
    verdict = report_data(summary.run_dir)["verdict"]
    assert verdict["status"] == "completed"
    assert not any("The run is" in w for w in verdict["warnings"]), verdict["warnings"]


# -- what is left on a shared server ----------------------------------------------------------


def shared_target() -> FakeTarget:
    target = FakeTarget(shared=True)
    # Something a sweep would never produce by itself: the restore must send it back verbatim.
    target.current.parameters["profile"].string_value = "kept"
    target.current.dynamic_batching.max_queue_delay_microseconds = 123
    return target


@pytest.mark.usefixtures("takes_seconds")
def test_a_shared_server_gets_its_original_config_back(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 3, "budget.validate_top": 1})
    target = shared_target()
    original = target.model_config()
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    assert target.current == original  # sent explicitly, field for field
    assert len(target.loads) > 1 and target.loads[-1] == original
    left = load_summary(summary.run_dir)["left_on_server"]
    assert left["config"] == "original" and left["knobs"] == knobs_of(original).to_dict()


@pytest.mark.usefixtures("takes_seconds")
def test_leave_best_applies_the_winner(tmp_path: Path) -> None:
    # Batched configs serve 3x the plain baseline: a significant gain, so the winner is the
    # recommendation, and what the shared server is left on.
    s = scenario(tmp_path, **{"budget.trials": 3, "budget.validate_top": 1, "run.leave": "best"})
    target = shared_target()
    target.current.ClearField("dynamic_batching")  # a plain baseline: 100 req/s
    load = PlantedCapacities(target, CPU_LIKE, batched_rps=300.0)
    summary = run_sweep(s, target=target, load=load)
    assert summary.best is not None and summary.data["gain_significant"] is True
    assert knobs_of(target.current) == summary.best.config
    assert target.current.parameters["profile"].string_value == "kept"
    left = load_summary(summary.run_dir)["left_on_server"]
    assert left["config"] == "best" and left["knobs"] == summary.best.config.to_dict()


@pytest.mark.usefixtures("takes_seconds")
def test_a_winner_not_significantly_better_is_not_recommended(tmp_path: Path) -> None:
    # Every config serves about the same (100 req/s +- 4 %): the winner's gain is within noise.
    # best/config.pbtxt holds the model's own config, the winner is only a candidate, and a
    # shared server with --leave best gets the original back.
    s = scenario(
        tmp_path,
        **{"budget.trials": 3, "budget.validate_top": 1, "run.leave": "best", "run.report": True},
    )
    target = shared_target()
    original = target.model_config()
    summary = run_sweep(s, target=target, load=PlantedCapacities(target, CPU_LIKE))
    data = load_summary(summary.run_dir)
    assert data["best"]["trial_number"] >= 0 and data["gain_significant"] is False
    assert data["recommendation"]["config"] == "original"
    assert data["recommendation"]["candidate_config"] == "candidate/config.pbtxt"
    assert "is not significantly better" in data["recommendation"]["detail"]
    best = parse_config_text((summary.run_dir / "best" / "config.pbtxt").read_text())
    assert knobs_of(best) == knobs_of(original)
    candidate = parse_config_text((summary.run_dir / "candidate" / "config.pbtxt").read_text())
    assert knobs_of(candidate).to_dict() == data["best"]["config"]
    assert data["best"]["config_path"] == "candidate/config.pbtxt"
    assert target.current == original
    assert data["left_on_server"]["knobs"] == knobs_of(original).to_dict()
    warnings = report_data(summary.run_dir)["verdict"]["warnings"]
    assert any("No searched config is significantly better" in w for w in warnings), warnings


@pytest.mark.usefixtures("takes_seconds")
def test_ctrl_c_restores_the_original_config(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 5, "budget.validate_top": 0})
    target = shared_target()
    original = target.model_config()
    summary = run_sweep(
        s, target=target, load=InterruptingGenerator(target, CPU_LIKE, interrupt_at=3)
    )
    assert summary.stop_reason == "interrupted"
    assert target.current == original
    assert load_summary(summary.run_dir)["left_on_server"]["config"] == "original"


@pytest.mark.usefixtures("takes_seconds")
def test_a_failed_sweep_restores_the_original_config(tmp_path: Path) -> None:
    class Failing(FakeTarget):
        def ensure_alive(self) -> None:
            if len(self.loads) >= 2:
                raise TargetError("the server at x stopped answering")

    s = scenario(tmp_path, **{"budget.trials": 5, "budget.validate_top": 0})
    target = Failing(shared=True)
    target.current.parameters["profile"].string_value = "kept"
    original = target.model_config()
    with pytest.raises(TargetError):
        run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    assert target.current == original
    (run_json,) = tmp_path.glob("*/run.json")
    state = json.loads(run_json.read_text())
    assert state["status"] == "failed" and state["left_on_server"]["config"] == "original"


@pytest.mark.usefixtures("takes_seconds")
def test_a_managed_server_says_it_left_nothing(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 2, "budget.validate_top": 0, "run.leave": "best"})
    target = FakeTarget()  # not shared: it is stopped at the end
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    left = load_summary(summary.run_dir)["left_on_server"]
    assert left["config"] is None and "stopped" in left["detail"]


def test_leave_is_a_run_key_and_not_part_of_the_hash(tmp_path: Path) -> None:
    plain = load_scenario(None, {}, env={})
    best = load_scenario(None, {"run.leave": "best"}, env={})
    assert plain.run.leave == "original" and best.run.leave == "best"
    assert plain.hash() == best.hash()  # leaving a config changes no measurement
    with pytest.raises(InputError, match=r"run\.leave"):
        load_scenario(None, {"run.leave": "winner"}, env={})


# -- models perfsweep cannot tune --------------------------------------------------------------


def ensemble(target: FakeTarget) -> None:
    target.current.platform = "ensemble"
    target.current.backend = ""
    step = target.current.ensemble_scheduling.step.add()
    step.model_name = "inner"
    step.model_version = -1


def sequence(target: FakeTarget) -> None:
    target.current.sequence_batching.max_sequence_idle_microseconds = 1000


@pytest.mark.parametrize(("make", "needle"), [(ensemble, "ensemble"), (sequence, "sequence")])
def test_ensembles_and_sequence_models_are_refused_before_any_load(
    tmp_path: Path, make: Any, needle: str
) -> None:
    target = FakeTarget(shared=True)
    make(target)
    with pytest.raises(InputError, match=needle) as info:
        run_sweep(scenario(tmp_path), target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    assert "tune" in str(info.value)  # says what perfsweep can tune instead
    assert target.loads == []  # nothing was pushed to the server
    assert not list(tmp_path.glob("*/run.json"))  # refused before the run started


# -- an interrupted trial is a recorded trial -------------------------------------------------


@pytest.mark.usefixtures("takes_seconds")
def test_ctrl_c_records_the_interrupted_trial(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 4, "budget.validate_top": 0})
    target = FakeTarget()
    first = run_sweep(
        s, target=target, load=InterruptingGenerator(target, CPU_LIKE, interrupt_at=3)
    )
    rec = load_trial_record(first.run_dir / "trials" / "001" / "measurement.json")
    assert rec["state"] == "interrupted" and rec["failure"] == INTERRUPTED_REASON
    assert first.trials == {"complete": 1, "failed": 0, "interrupted": 1, "total": 2}
    resumed = run_sweep(
        s,
        target=target,
        load=FakeLoadGenerator(target, CPU_LIKE),
        run_dir=first.run_dir,
        resume=True,
    )
    assert resumed.trials == {"complete": 4, "failed": 0, "interrupted": 1, "total": 5}
    frame = pd.read_csv(first.run_dir / "trials.csv")
    assert frame.loc[frame.number == 1, "state"].item() == "interrupted"


# -- edges: URLs and storages ------------------------------------------------------------------


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8000", "grpc://triton:443/"])
def test_other_schemes_are_refused_at_the_edge(url: str) -> None:
    with pytest.raises(InputError, match="http:// or https://"):
        http_url(url)
    with pytest.raises(InputError, match="http:// or https://"):
        load_scenario(None, {"model.url": url}, env={})
    with pytest.raises(InputError, match="http:// or https://"):
        RemoteTarget(url, "m")


def test_https_urls_are_kept_for_tls() -> None:
    assert http_url("HTTPS://triton:443/") == "https://triton:443"
    assert RemoteTarget("https://127.0.0.1:8443", "m").url == "https://127.0.0.1:8443"


def test_plain_addresses_become_http_urls() -> None:
    assert http_url("127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert http_url("http://h:1/") == "http://h:1"


def test_postgres_storage_without_psycopg2_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # import psycopg2 fails, as when absent
    s = scenario(
        tmp_path,
        **{"run.storage": "postgresql://u:p@127.0.0.1:1/db", "run.study_name": "x"},
    )
    target = FakeTarget()
    with pytest.raises(InputError, match=r"pip install 'perfsweep\[postgres\]'"):
        run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))


# -- a config that kills its server -----------------------------------------------------------


@pytest.mark.usefixtures("takes_seconds")
def test_a_config_that_kills_the_server_twice_is_a_finding_and_the_search_goes_on(
    tmp_path: Path,
) -> None:
    class Crashing(FakeTarget):
        """Trial 0's config kills the server at both of its loads (loads 2 and 3)."""

        restarts = 0

        def load_config(self, config: Any) -> None:
            super().load_config(config)
            if len(self.loads) in (2, 3):
                self.dead = True
                raise TargetDiedError("the server at x died while loading a config", self.url)

        def ensure_alive(self) -> None:
            if getattr(self, "dead", False):
                self.dead, self.restarts = False, self.restarts + 1

        def describe(self) -> dict[str, Any]:
            return {**super().describe(), "restarts": self.restarts}

    s = scenario(tmp_path, **{"budget.trials": 3, "budget.validate_top": 1, "run.report": True})
    target = Crashing()
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    rec = load_trial_record(summary.run_dir / "trials" / "000" / "measurement.json")
    assert rec["state"] == "failed" and rec["failure"].startswith("crashed the server twice")
    assert summary.trials["complete"] == 2 and summary.stop_reason != "server_died"
    data = load_summary(summary.run_dir)
    assert [(e["trial"], e["event"]) for e in data["server_events"]] == [
        (0, "died"),
        (0, "crashed the server"),
    ]
    assert data["server_restarts"] == 2 and data["files"]["best_config"]
    warnings = report_data(summary.run_dir)["verdict"]["warnings"]
    assert any("crashed the server twice (trials 0)" in w for w in warnings), warnings
