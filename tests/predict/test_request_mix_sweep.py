"""A sweep whose request data the profile cannot represent says why and searches with tpe before
any trial (the real profile phase, :func:`analyzer.sweep.predictions.probe_profile`, on a planted target)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs
from analyzer.config.scenario import load_scenario
from analyzer.predict.probe_plan import PROBE_DELAY_US
from analyzer.rundir import records
from analyzer.sweep.loop import run_sweep
from analyzer.sweep.state import SweepObserver
from tests.sweep.planted import FakeLoadGenerator, FakeTarget, SimulatedDevice, planted_profile


class Events(SweepObserver):
    """What the console would print, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_note(self, text: str) -> None:
        self.events.append(("note", text))

    def on_trial_start(
        self, number: int, source: str, knobs: Knobs, index: int, budget: int
    ) -> None:
        self.events.append(("trial", (number, source)))


def text_target() -> FakeTarget:
    """A planted target whose model has two INT64 ``[-1]`` inputs, as a text classifier."""
    target = FakeTarget(base_max_batch_size=8)
    for name in ("IDS", "MASK"):
        target.current.input.add(name=name, data_type=mc.TYPE_INT64, dims=[-1])
        target.current.output.add(name=f"{name}_OUT", data_type=mc.TYPE_INT64, dims=[-1])
    return target


@pytest.mark.usefixtures("takes_seconds")
def test_data_whose_inputs_do_not_grow_together_falls_back_to_tpe_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe reads the server's statistics first; the planted target has them (none yet).
    monkeypatch.setattr(
        "analyzer.target.server_stats.http_stats_source",
        lambda url, model, transport=None: lambda: {"model_stats": []},
    )
    data = tmp_path / "crossed.json"
    data.write_text(
        json.dumps(
            {"data": [{"IDS": [1] * 10, "MASK": [1] * 50}, {"IDS": [1] * 20, "MASK": [1] * 5}]}
        )
    )
    scenario = load_scenario(
        None,
        {
            "input.data_file": str(data),
            "space.max_batch_size": [1, 8],
            "space.instance_count": [1, 1],
            "budget.trials": 2,
            "run.output_dir": str(tmp_path),
        },
        env={},
    )
    target = text_target()
    load = FakeLoadGenerator(target, SimulatedDevice(profile=planted_profile(8)), noise=0.0)
    events = Events()
    outcome = run_sweep(scenario, target=target, load=load, observer=events)
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "tpe"
    note = summary.search_note or ""
    assert "no profile could be taken" in note and "do not grow together" in note, note
    assert "searching with tpe" in note
    # Said before anything was measured: the profile phase's own start is the only one before.
    said = next(
        i for i, (kind, text) in enumerate(events.events) if kind == "note" and text == note
    )
    assert [e for e in events.events[:said] if e[0] == "trial"] == [("trial", (-1, "profile"))]
    assert not (outcome.run_dir / "predictions.json").exists()
    # No probe config was ever loaded: the probe refused before sending anything.
    assert target.loads and all(
        c.dynamic_batching.max_queue_delay_microseconds != PROBE_DELAY_US for c in target.loads
    )
