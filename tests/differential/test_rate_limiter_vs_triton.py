"""The rate limiter against the real Triton 2.51: same request stream, same outcome.

Each server runs with ``--rate-limit execution_count`` (one scenario with ``off``) and
Python-backend sleep models (the reference: its identity backend, same ``execute_delay_ms``),
one instance per model, so a model's statistics are its instance's. Compared: the order in
which the models' executions finished, how many ran at once, each model's batch statistics, and
the replies to loads whose resources cannot be scheduled. The reference server is started by a
local handle (``_Reference``): the shared ones in ``tests/support`` take no rate-limit options.

The streams are deterministic by construction: a *holder* request (dynamic batching with a
300 ms queue delay, so it is seen pending, then seen leaving the queue) takes the contended
resource first; every other request is seen pending before the next is sent, and all of them
wait while the holder runs. From then on the order depends only on the rate limiter's rule
(lowest ``exec_count x priority``, one allocation attempt per event), never on thread timing.
Executions take 400 ms or more, so the client tells them apart by completion time alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from tests.support.real_triton import (
    RealTriton,
    TritonInstall,
    dynamic_batching,
    sleep_model_config,
)
from tests.support.servers import ReferenceServer, wait_until

pytestmark = [pytest.mark.usefixtures("quiet_machine"), pytest.mark.triton, pytest.mark.slow]

EXEC_MS = 400
HOLD_MS = 2500
#: The holder's queue delay: long enough to be seen pending, then seen leaving the queue.
HOLD_DELAY_US = 300_000


class Server(Protocol):
    """What the scenarios use of either server."""

    @property
    def http_url(self) -> str: ...

    def http_status(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 10.0
    ) -> tuple[int, bytes]: ...

    def metrics_text(self) -> str: ...


def _model(
    name: str,
    priority: int = 0,
    resources: Sequence[tuple[str, int, bool]] = (),
    *,
    exec_ms: int = EXEC_MS,
    holder: bool = False,
) -> mc.ModelConfig:
    """A one-instance sleep model with a ``rate_limiter`` section (``(name, count, global)``)."""
    block = dynamic_batching(preferred=(8,), max_queue_delay_us=HOLD_DELAY_US) if holder else None
    config = sleep_model_config(name, dynamic_batching=block, execute_delay_ms=exec_ms)
    limiter = config.instance_group[0].rate_limiter
    limiter.priority = priority
    for resource_name, count, is_global in resources:
        resource = limiter.resources.add()
        resource.name = resource_name
        resource.count = count
        setattr(resource, "global", is_global)
    return config


# ------------------------------------------------------------------------------ scenarios

#: Which instance runs first: p (priority 2) asks before q (priority 1), q runs first.
FIRST = [
    _model("f_hold", 1, [("F", 1, True)], exec_ms=HOLD_MS, holder=True),
    _model("f_p2", 2, [("F", 1, True)]),
    _model("f_p1", 1, [("F", 1, True)]),
]
#: Priority 1 vs 2 under saturation: 6 requests each wait for R while the holder runs.
RATIO = [
    _model("r_hold", 1, [("R", 1, True)], exec_ms=HOLD_MS, holder=True),
    _model("r_a", 1, [("R", 1, True)]),
    _model("r_b", 2, [("R", 1, True)]),
]
#: Head-of-line blocking: x needs nothing but queues behind y, which waits for H.
HOL = [
    _model("h_hold", 1, [("H", 1, True)], exec_ms=HOLD_MS, holder=True),
    _model("h_y", 1, [("H", 1, True)]),
    _model("h_x", 10),
]
#: How many execute at once: two models needing C:1 (per device).
PAIR = [
    _model("c_a", 1, [("C", 1, False)], exec_ms=1000, holder=True),
    _model("c_b", 1, [("C", 1, False)], exec_ms=1000, holder=True),
]
#: Batches waiting for the rate limiter are not capped at 2 per instance (§3.5, §3.11): with
#: preferred sizes 2 and 4 and no delay, 8 requests arriving one by one while R is held form four
#: batches of 2. Were the cap applied, the last 4 would stay queued and form one batch of 4.
PREFETCH = [
    _model("p_hold", 1, [("P", 1, True)], exec_ms=HOLD_MS, holder=True),
    _model("p_m", 1, [("P", 1, True)]),
]
PREFETCH[1].max_batch_size = 4
PREFETCH[1].dynamic_batching.CopyFrom(dynamic_batching(preferred=(2, 4)))
#: Without prefetching (priority levels) a batch is formed only for an idle instance: while
#: S is held, one request waits in the rate limiter and the rest stay queued, where a later
#: priority-1 request still overtakes the earlier priority-2 ones.
POLICY = [
    _model("s_hold", 1, [("S", 1, True)], exec_ms=HOLD_MS, holder=True),
    _model("s_m", 1, [("S", 1, True)]),
]
POLICY[1].max_batch_size = 1
POLICY[1].dynamic_batching.CopyFrom(dynamic_batching(priority_levels=2, default_priority_level=2))
#: Loaded after the others on a server with --rate-limit-resource=C:2: each must fail.
REFUSED = [
    _model("x_need3", 1, [("C", 3, False)]),
    _model("x_uncovered", 1, [("D", 1, False)]),
    _model("x_lowercase", 1, [("c", 1, False)]),
    _model("x_global", 1, [("C", 1, True)]),
]


@dataclass(frozen=True)
class Send:
    """One request: to ``model`` (with ``priority``, 0 = not sent); ``hold`` = wait until it is
    executing before going on."""

    model: str
    hold: bool = False
    priority: int = 0


@dataclass(frozen=True)
class Observation:
    """What a client and the statistics extension see of a stream.

    Attributes:
        order: models whose executions finished together (within half an execution; sorted),
            group by group in completion order.
        requests: the same groups as request indices.
        at_once: the most executions that finished together.
        batches: ``{batch size: executions}`` per model (statistics extension).
        errors: failed requests (index -> message).
    """

    order: tuple[tuple[str, ...], ...]
    requests: tuple[tuple[int, ...], ...]
    at_once: int
    batches: dict[str, dict[int, int]]
    errors: dict[int, str]


def _pending(server: Server, model: str) -> int:
    for line in server.metrics_text().splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _infer(url: str, send: Send, index: int, done: dict[int, tuple[float, str | None]]) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=120.0)
    data = np.full((1, 16), float(index), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    try:
        reply = client.infer(send.model, [tensor], priority=send.priority)
        result = reply.as_numpy("OUTPUT0")
        assert result is not None and np.array_equal(result, data), f"request {index}: bad output"
        done[index] = (time.monotonic(), None)
    except InferenceServerException as exc:
        done[index] = (time.monotonic(), str(exc.message()))
    finally:
        client.close()


def run_stream(server: Server, sends: Sequence[Send], exec_ms: int = EXEC_MS) -> Observation:
    """Send the stream (each request on its own thread), wait for every answer, observe."""
    done: dict[int, tuple[float, str | None]] = {}
    threads = []
    queued: dict[str, int] = {}
    for index, send in enumerate(sends):
        thread = threading.Thread(
            target=_infer, args=(server.http_url, send, index, done), daemon=True
        )
        thread.start()
        threads.append(thread)
        queued[send.model] = queued.get(send.model, 0) + 1
        wait_until(
            lambda m=send.model, n=queued[send.model]: _pending(server, m) >= n,
            30,
            f"request {index} to be queued",
        )
        if send.hold:
            wait_until(
                lambda m=send.model: _pending(server, m) == 0, 30, f"request {index} to start"
            )
            queued[send.model] -= 1
    for thread in threads:
        thread.join(120)
    assert len(done) == len(sends), f"only {len(done)} of {len(sends)} answered"
    finished = sorted((t, i) for i, (t, error) in done.items() if error is None)
    groups: list[list[int]] = []
    last = -1e9
    for completed, index in finished:
        if completed - last > exec_ms / 2000 or not groups:
            groups.append([])
        groups[-1].append(index)
        last = completed
    models = sorted({send.model for send in sends})
    return Observation(
        order=tuple(tuple(sorted(sends[i].model for i in g)) for g in groups),
        requests=tuple(tuple(sorted(g)) for g in groups),
        at_once=max((len(g) for g in groups), default=0),
        batches={m: _batch_stats(server, m, sum(s.model == m for s in sends)) for m in models},
        errors={i: error for i, (_, error) in done.items() if error is not None},
    )


def _batch_stats(server: Server, model: str, requests: int) -> dict[int, int]:
    """``{batch size: executions}`` once they account for ``requests`` (bs 1 each).

    Triton's Python backend reports statistics just after the responses: wait for them.
    """
    seen: dict[int, int] = {}

    def caught_up() -> bool:
        status, body = server.http_status("GET", f"/v2/models/{model}/stats")
        assert status == 200, body
        entries = json.loads(body)["model_stats"][0]["batch_stats"]
        seen.clear()
        seen.update({int(e["batch_size"]): int(e["compute_infer"]["count"]) for e in entries})
        return sum(size * count for size, count in seen.items()) >= requests

    wait_until(caught_up, 10, f"statistics of {model}")
    return dict(seen)


# ------------------------------------------------------------------------------ the servers


@contextmanager
def _server(
    kind: str,
    workdir: Path,
    install: TritonInstall,
    models: Sequence[mc.ModelConfig],
    rate_limit: str = "execution_count",
    resources: Sequence[str] = (),
) -> Iterator[Any]:
    if kind == "triton":
        args = [f"--rate-limit={rate_limit}", *(f"--rate-limit-resource={r}" for r in resources)]
        with RealTriton(install, workdir / kind, models=models, extra_args=args) as triton:
            yield triton
    else:
        options = {"rate_limit": rate_limit, "rate_limit_resources": tuple(resources)}
        with ReferenceServer(workdir / kind, models, options=options) as reference:
            yield reference


# ------------------------------------------------------------------------------ the streams

STREAM_FIRST = (Send("f_hold", hold=True), Send("f_p2"), Send("f_p1"))
STREAM_RATIO = (
    Send("r_hold", hold=True),
    *(Send(m) for _ in range(6) for m in ("r_b", "r_a")),
)
STREAM_HOL = (Send("h_hold", hold=True), Send("h_y"), Send("h_x"))
STREAM_PAIR = (Send("c_a"), Send("c_b"))
STREAM_POLICY = (
    Send("s_hold", hold=True),
    *(Send("s_m", priority=2) for _ in range(3)),
    Send("s_m", priority=1),
)
STREAM_PREFETCH = (Send("p_hold", hold=True), *(Send("p_m") for _ in range(8)))


def _observe_contended(server: Server) -> dict[str, Observation]:
    return {
        "first": run_stream(server, STREAM_FIRST),
        "ratio": run_stream(server, STREAM_RATIO),
        "hol": run_stream(server, STREAM_HOL),
        "pair": run_stream(server, STREAM_PAIR, exec_ms=1000),
        "prefetch": run_stream(server, STREAM_PREFETCH),
        "policy": run_stream(server, STREAM_POLICY),
    }


def _load_replies(server: Any) -> dict[str, tuple[int, str]]:
    replies = {}
    for config in REFUSED:
        server.add_model(config)
        status, body = server.http_status(
            "POST", f"/v2/repository/models/{config.name}/load", {}, timeout_s=120
        )
        replies[config.name] = (status, json.loads(body).get("error", ""))
    return replies


def _observe(kind: str, workdir: Path, install: TritonInstall) -> dict[str, Any]:
    """Every scenario on one server (``kind``): {scenario: observation}."""
    seen: dict[str, Any] = {}
    with _server(
        kind, workdir / "default", install, FIRST + RATIO + HOL + PAIR + PREFETCH + POLICY
    ) as s:
        seen.update(_observe_contended(s))
    with _server(kind, workdir / "plenty", install, PAIR, resources=["C:2"]) as s:
        seen["pair_plenty"] = run_stream(s, STREAM_PAIR, exec_ms=1000)
        seen["refused"] = _load_replies(s)
    with _server(kind, workdir / "off", install, PAIR, rate_limit="off") as s:
        seen["pair_off"] = run_stream(s, STREAM_PAIR, exec_ms=1000)
    return seen


@pytest.fixture(scope="module")
def observations(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Every scenario on both servers: {kind: {scenario: observation}}.

    The two servers play their streams at the same time, each from its own thread: the streams
    are 52 s of executions and holds (26 s per server), nearly all of it sleeping, and nothing
    in an observation depends on timing but the holder outlasting the requests queued behind
    it (see the module docstring).
    """
    kinds = ("triton", "reference")
    workdirs = {kind: tmp_path_factory.mktemp(f"rl_{kind}") for kind in kinds}
    with ThreadPoolExecutor(len(kinds)) as pool:
        futures = {k: pool.submit(_observe, k, workdirs[k], triton_install) for k in kinds}
        return {kind: future.result() for kind, future in futures.items()}


def test_triton_shows_the_documented_rate_limiter(observations: dict[str, dict[str, Any]]) -> None:
    triton = observations["triton"]
    # Which instance runs first: the lower exec_count x priority (2 x 1 < 2 x 2), not the
    # earlier request.
    assert triton["first"].order == (("f_hold",), ("f_p1",), ("f_p2",))
    # Priority 1 vs 2: a runs twice as often while both wait (ties go to the one staged first).
    assert "".join(g[0][-1] for g in triton["ratio"].order[1:]) == "aabaabaabbbb"
    assert triton["ratio"].batches == {"r_a": {1: 6}, "r_b": {1: 6}, "r_hold": {1: 1}}
    # Head-of-line blocking: x needs no resource, yet runs only after y.
    assert triton["hol"].order == (("h_hold",), ("h_y",), ("h_x",))
    # How many execute at once: 1 with C's default capacity (the largest need), 2 with C:2,
    # 2 with the rate limiter off.
    assert (triton["pair"].at_once, triton["pair_plenty"].at_once) == (1, 2)
    assert triton["pair_off"].at_once == 2
    for name in ("first", "ratio", "hol"):
        assert triton[name].at_once == 1, name
    assert triton["prefetch"].batches["p_m"] == {2: 4}
    # Non-prefetch: request 1 was bound when it came; 4 (priority 1) overtakes 2 and 3.
    assert triton["policy"].requests == ((0,), (1,), (4,), (2,), (3,))
    refused = triton["refused"]
    assert refused["x_need3"][1].endswith(
        'Invalid argument: Resource count for "C" is limited to 2 which will prevent '
        "scheduling of one or more model instances, the minimum required count is 3;\n"
    )
    assert '"D" is limited to 0 ' in refused["x_uncovered"][1]
    assert '"c" is limited to 0 ' in refused["x_lowercase"][1]  # names are case-sensitive
    assert 'Resource "C" is present as both global and device-specific' in refused["x_global"][1]


@pytest.mark.parametrize(
    "scenario",
    ["first", "ratio", "hol", "pair", "prefetch", "policy", "pair_plenty", "pair_off", "refused"],
)
def test_reference_rate_limits_like_triton(
    scenario: str, observations: dict[str, dict[str, Any]]
) -> None:
    reference, triton = observations["reference"][scenario], observations["triton"][scenario]
    assert reference == triton, (
        f"reference server differs from Triton in {scenario}:\n"
        f"  reference: {reference}\n  triton:    {triton}"
    )
