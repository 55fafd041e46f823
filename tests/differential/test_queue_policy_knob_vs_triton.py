"""The searched queue policies (``analyzer.config.choices.queue_policy_choices``) on the real
Triton 2.51.

Every timed choice of a two-level search is written by ``apply_knobs`` into a Python-backend sleep
model; the real Triton must load it, report a config that reads back as the same knobs, and
answer requests sent with a ``priority`` (and a ``timeout``). The reference server must do the
same with the same request stream: the same requests rejected, the same execution order. The
stream plants the difference between the policies: a low-priority request that waits longer
than its level's timeout while a high-priority one arrives behind it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import queue_policy_choices
from analyzer.config.knobs import Knobs, QueuePolicyKnob
from analyzer.config.model_config import apply_knobs, knobs_of
from reference_server.core.config import config_from_json
from tests.support.differential import Observation, Send, run_scenario
from tests.support.real_triton import TritonInstall, dynamic_batching, sleep_model_config
from tests.support.servers import ServerKind, start_server

pytestmark = [pytest.mark.triton, pytest.mark.slow]

#: Execution time: the low request's timeout (0.5 x the goal) expires long before it ends.
EXEC_MS = 600
GOAL_MS = 400.0

#: 0 (low) runs at once; 1 (low) queues at ~0.1 s and expires at ~0.3 s; 2 (high, with a request
#: timeout its level ignores: no default timeout) queues behind it at ~0.15 s.
SENDS = (
    Send(priority=2),
    Send(priority=2, pause_s=0.1),
    Send(priority=1, timeout_us=1_000, pause_s=0.05),
)


def _choices() -> dict[str, QueuePolicyKnob]:
    """FIFO and the 0.5 x goal REJECT and DELAY choices of the search, by name."""
    found = queue_policy_choices("search", 2, GOAL_MS, factors=(0.5,))
    named = {"fifo": found[0], "reject": found[2], "delay": found[3]}
    assert all(isinstance(k, QueuePolicyKnob) for k in named.values())
    return {name: k for name, k in named.items() if k is not None}


def _knobs(policy: QueuePolicyKnob) -> Knobs:
    return Knobs(1, 0, (), 1, queue_policy=policy)


def _configs() -> list[mc.ModelConfig]:
    configs = []
    for name, policy in _choices().items():
        base = sleep_model_config(
            f"qp_{name}",
            max_batch_size=4,
            dynamic_batching=dynamic_batching(max_queue_delay_us=100),
            execute_delay_ms=EXEC_MS,
        )
        configs.append(apply_knobs(base, _knobs(policy)))
    return configs


def _run(kind: ServerKind, workdir: Path, install: TritonInstall | None) -> dict[str, object]:
    out: dict[str, object] = {}
    configs = _configs()
    with start_server(kind, workdir / kind, configs, triton_install=install) as server:
        for config in configs:
            status, body = server.http_status("GET", f"/v2/models/{config.name}/config")
            assert status == 200, body
            out[f"{config.name}/knobs"] = knobs_of(config_from_json(json.dumps(json.loads(body))))
            out[config.name] = run_scenario(server, config.name, config, SENDS)
    return out


@pytest.fixture(scope="module")
def runs(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, object]]:
    workdir = tmp_path_factory.mktemp("queue_policy")
    return {
        "triton": _run("triton", workdir, triton_install),
        "reference": _run("reference", workdir, None),
    }


def test_triton_loads_every_choice_and_reports_the_same_knobs(
    runs: dict[str, dict[str, object]],
) -> None:
    for name, policy in _choices().items():
        reported = runs["triton"][f"qp_{name}/knobs"]
        # FIFO is written as no priorities at all, so it reads back as the model's own (None).
        expected = Knobs(1, 0, (), 1) if policy.fifo else _knobs(policy)
        assert reported == expected, name


def test_the_policies_treat_the_planted_stream_as_triton_documents(
    runs: dict[str, dict[str, object]],
) -> None:
    triton = runs["triton"]
    fifo, reject, delay = (triton[f"qp_{n}"] for n in ("fifo", "reject", "delay"))
    assert isinstance(fifo, Observation) and isinstance(reject, Observation)
    assert isinstance(delay, Observation)
    # One FIFO queue: arrival order, nothing refused (the request timeout needs a policy).
    assert fifo.groups == ((0,), (1,), (2,)) and not fifo.errors
    # Priorities: the high request overtakes; REJECT refuses the expired low one...
    assert reject.groups == ((0,), (2,)) and reject.errors == {
        1: ("503", "Request timeout expired")
    }
    # ...DELAY runs it after the requests that did not expire.
    assert delay.groups == ((0,), (2,), (1,)) and not delay.errors


def test_the_reference_server_matches_triton(runs: dict[str, dict[str, object]]) -> None:
    assert runs["reference"] == runs["triton"]
