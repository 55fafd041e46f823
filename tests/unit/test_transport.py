"""Refused versus dead, without a server: the targets' HTTP logic behind a ``MockTransport``.

A server that answers and refuses a config is a failed trial (``ConfigRejectedError``); a server
that does not answer is a target failure (``TargetError``: restart, or stop the run). Each case
is acted out by a handler that answers or raises what urllib raises.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.scenario import load_scenario
from analyzer.errors import InputError, TargetDiedError, TargetError
from analyzer.target.factory import make_target
from analyzer.target.managed import ManagedServer
from analyzer.target.protocol import ConfigRejectedError, read_device_info
from analyzer.target.remote import RemoteTarget
from analyzer.target.transport import (
    HTTPStatusError,
    KeepAliveTransport,
    MockTransport,
    Request,
    Response,
    UrllibTransport,
    http_json,
)

URL = "http://server.invalid:8000"
CONFIG = {"name": "m", "max_batch_size": 8, "a_field_from_a_newer_server": 1}

Route = Response | BaseException | Callable[[Request], Response]


class FakeClock:
    """Monotonic time that moves only when the target sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1


def server(routes: dict[str, Route]) -> MockTransport:
    """A transport answering ``"METHOD /path"`` (any host) from ``routes``; else a 404."""

    def handle(request: Request) -> Response:
        key = f"{request.method} {urlsplit(request.url).path}"
        route = routes.get(key, Response.of_json(404, {"error": f"no route {key}"}))
        if isinstance(route, BaseException):
            raise route
        return route(request) if callable(route) else route

    return MockTransport(handle)


def remote(routes: dict[str, Route], clock: FakeClock | None = None) -> RemoteTarget:
    clock = clock or FakeClock()
    return RemoteTarget(URL, "m", transport=server(routes), clock=clock, sleep=clock.sleep)


OK = Response.of_json(200, {})
REFUSED = ConnectionRefusedError(111, "Connection refused")
LOAD = "POST /v2/repository/models/m/load"
LIVE = "GET /v2/health/live"
READY = "GET /v2/models/m/ready"


def test_a_config_refused_by_a_live_server_is_a_rejection() -> None:
    for status in (400, 500):  # Triton answers a refused override with 400 or "failed to load"
        target = remote({LOAD: Response.of_json(status, {"error": "bad preferred"}), LIVE: OK})
        with pytest.raises(ConfigRejectedError, match=rf"refused the config \({status}\): bad"):
            target.load_config(mc.ModelConfig(name="m"))


def test_a_triton_that_loads_no_model_on_request_stops_the_run_with_the_flag_to_use() -> None:
    """Triton's answer outside explicit mode (its words, measured on Triton 2.51): no trial
    could run, so it is an input error naming the server flag, not a failed trial."""
    said = "explicit model load / unload is not allowed if polling is enabled"
    target = remote({LOAD: Response.of_json(503, {"error": said}), LIVE: OK})
    with pytest.raises(InputError, match="--model-control-mode=explicit") as caught:
        target.load_config(mc.ModelConfig(name="m"))
    assert not isinstance(caught.value, TargetError) and said in str(caught.value)


def test_an_error_from_a_server_that_went_away_is_a_death() -> None:
    target = remote({LOAD: Response.of_json(500, {"error": "shutting down"}), LIVE: REFUSED})
    with pytest.raises(TargetDiedError, match=r"died while loading a config \(500: shutting"):
        target.load_config(mc.ModelConfig(name="m"))
    not_live = remote({LOAD: Response(502, b"Bad Gateway"), LIVE: Response(503)})
    with pytest.raises(TargetDiedError, match="Bad Gateway"):
        not_live.load_config(mc.ModelConfig(name="m"))
    silent = remote({LOAD: REFUSED, LIVE: REFUSED})
    with pytest.raises(TargetDiedError, match=r"died while loading a config: .*refused"):
        silent.load_config(mc.ModelConfig(name="m"))


def test_a_server_that_dies_while_the_model_loads_is_not_waited_for_until_the_timeout() -> None:
    clock = FakeClock()
    target = remote({LOAD: OK, READY: Response(503), LIVE: REFUSED}, clock)
    with pytest.raises(TargetDiedError, match="died while loading m"):
        target.load_config(mc.ModelConfig(name="m"))
    assert clock.now < 1.0  # not load_timeout_s (300 s)


@pytest.mark.parametrize("error", [REFUSED, TimeoutError("timed out")])
def test_no_answer_to_a_load_from_a_live_server_is_a_target_failure(error: OSError) -> None:
    target = remote({LOAD: error, LIVE: OK})
    with pytest.raises(TargetError, match=r"loading a config into .* failed") as info:
        target.load_config(mc.ModelConfig(name="m"))
    assert not isinstance(info.value, ConfigRejectedError)


def test_load_sends_the_config_override_and_waits_until_ready() -> None:
    answers = iter([Response(503), Response(503), OK])
    clock = FakeClock()
    target = remote({LOAD: OK, READY: lambda _: next(answers), LIVE: OK}, clock)
    target.load_config(mc.ModelConfig(name="m", max_batch_size=4))
    transport = target.transport
    assert isinstance(transport, MockTransport)
    sent = transport.requests[0]
    assert (sent.method, sent.url) == ("POST", URL + "/v2/repository/models/m/load")
    assert json.loads(sent.body["parameters"]["config"]) == {"name": "m", "max_batch_size": 4}
    assert clock.sleeps == 2


def test_a_load_with_engine_files_unloads_the_running_model_first() -> None:
    # Triton keeps a loaded model's instances when only the override files differ: unloaded
    # first, the model starts from the new engine file.
    loaded = {"ready": True}

    def unload(_: Request) -> Response:
        loaded["ready"] = False
        return OK

    def load(_: Request) -> Response:
        loaded["ready"] = True
        return OK

    target = remote(
        {
            LOAD: load,
            "POST /v2/repository/models/m/unload": unload,
            READY: lambda _: Response(200) if loaded["ready"] else Response(400),
            LIVE: OK,
        }
    )
    files = {"file:1/model.json": b'{"max_num_seqs": 4}'}
    target.load_config(mc.ModelConfig(name="m", max_batch_size=0), files=files)
    transport = target.transport
    assert isinstance(transport, MockTransport)
    posts = [urlsplit(r.url).path for r in transport.requests if r.method == "POST"]
    assert posts == ["/v2/repository/models/m/unload", "/v2/repository/models/m/load"]
    sent = next(r for r in transport.requests if r.url.endswith("/load"))
    assert "file:1/model.json" in sent.body["parameters"]
    # Without files a load is a reload in place, as before.
    transport.requests.clear()
    target.load_config(mc.ModelConfig(name="m", max_batch_size=0))
    assert [r.method for r in transport.requests if r.method == "POST"] == ["POST"]


def test_a_model_that_never_gets_ready_after_a_load_times_out() -> None:
    clock = FakeClock()
    target = remote({LOAD: OK, READY: Response(503), LIVE: OK}, clock)
    with pytest.raises(TargetError, match="was not ready 300 s after load"):
        target.load_config(mc.ModelConfig(name="m"))
    assert clock.now > target.load_timeout_s


def test_start_tells_an_unreachable_server_from_a_missing_model() -> None:
    with pytest.raises(TargetError, match=r"cannot reach .* \(\[Errno 111\] Connection refused\)"):
        remote({"GET /v2/health/ready": REFUSED}).start()
    with pytest.raises(TargetError, match=r"cannot reach .* \(HTTP 503\); check --url"):
        remote({"GET /v2/health/ready": Response(503)}).start()
    with pytest.raises(TargetError, match=r"model 'm' is not ready .* load it first"):
        remote({"GET /v2/health/ready": OK, READY: Response.of_json(400, {"error": "x"})}).start()
    remote({"GET /v2/health/ready": OK, READY: OK}).start()


def test_a_server_that_comes_up_within_the_timeout_is_reached() -> None:
    answers = iter([REFUSED, Response(503), OK])

    def ready(_: Request) -> Response:
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    remote({"GET /v2/health/ready": ready, READY: OK}).start()


@pytest.mark.parametrize("dead", [REFUSED, TimeoutError("timed out"), Response(503)])
def test_a_remote_server_that_does_not_return_in_time_stops_the_run(dead: Route) -> None:
    live = remote({LIVE: OK})
    live.ensure_alive()
    assert live.outages == []
    clock = FakeClock()
    target = remote({LIVE: dead}, clock)
    target.wait_s = 30.0
    heard: list[str] = []
    target.notify = heard.append
    with pytest.raises(TargetDiedError, match=r"did not return within 30 s"):
        target.ensure_alive()
    assert 30.0 <= clock.now <= 31.0  # polled once a second for the whole wait, no longer
    assert [o["returned"] for o in target.outages] == [False]
    assert heard == [f"the server at {URL} is not answering: waiting up to 30 s for it to return"]
    target.wait_s = 0.0  # the gate's setting: no wait at all
    with pytest.raises(TargetDiedError):
        target.ensure_alive()
    assert clock.now <= 31.0


def test_a_remote_server_back_within_the_wait_gets_its_last_config_again() -> None:
    clock = FakeClock()
    answers = iter([REFUSED] * 6)

    def live(_: Request) -> Response:
        error = next(answers, None)
        if error is not None:
            raise error
        return OK

    target = remote({LIVE: live, LOAD: OK, READY: OK}, clock)
    target.load_config(mc.ModelConfig(name="m", max_batch_size=4))
    target.ensure_alive()
    assert [(o["returned"], o["waited_s"]) for o in target.outages] == [(True, 5.0)]
    transport = target.transport
    assert isinstance(transport, MockTransport)
    loads = [r for r in transport.requests if r.method == "POST"]
    assert len(loads) == 2 and loads[0].body == loads[1].body  # the same config, pushed again
    assert target.describe()["outages"] == target.outages


def test_model_config_reads_newer_servers_and_names_a_missing_model() -> None:
    config = remote({"GET /v2/models/m/config": Response.of_json(200, CONFIG)}).model_config()
    assert (config.name, config.max_batch_size) == ("m", 8)
    with pytest.raises(TargetError, match=r"has no model 'm' \(404: no route"):
        remote({}).model_config()
    with pytest.raises(TargetError, match="cannot read the config of m"):
        remote({"GET /v2/models/m/config": REFUSED}).model_config()


def test_metadata_and_describe_survive_a_dead_server() -> None:
    meta = {"name": "triton", "version": "2.51.0"}
    assert remote({"GET /v2": Response.of_json(200, meta)}).describe()["server_version"] == "2.51.0"
    assert remote({"GET /v2": REFUSED}).describe()["server"] is None


def test_device_info_is_scraped_through_the_transport() -> None:
    text = (
        'perfsweep_model_device_info{model="m",backend="simulated",device="sim0"} 1\n'
        'perfsweep_model_device_info{model="other",backend="onnxruntime",device="cpu"} 1\n'
    )
    metrics = "http://server.invalid:8002/metrics"
    transport = MockTransport(lambda r: Response(200, text.encode()))
    assert read_device_info(metrics, "m", transport) == [
        {"model": "m", "backend": "simulated", "device": "sim0"}
    ]
    assert read_device_info(metrics, "m", server({})) == []  # a 404 is nothing to read
    assert read_device_info(metrics, "m", server({"GET /metrics": REFUSED})) == []
    assert read_device_info("", "m", transport) == []


def test_http_json_decodes_json_text_and_nothing() -> None:
    answers = {
        "/j": Response.of_json(200, {"a": 1}),
        "/t": Response(500, b"plain"),
        "/e": Response(204),
    }
    transport = MockTransport(lambda r: answers[r.url.removeprefix(URL)])
    assert http_json("GET", URL + "/j", transport=transport) == (200, {"a": 1})
    assert http_json("GET", URL + "/t", transport=transport) == (500, "plain")
    assert http_json("GET", URL + "/e", transport=transport) == (204, None)


@pytest.mark.usefixtures("serves")
def test_urllib_transport_raises_oserror_for_a_refused_connection() -> None:
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OSError):
        UrllibTransport().request(Request("GET", f"http://127.0.0.1:{port}/v2", None, 2.0))


def test_make_target_picks_remote_or_managed(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "m"\ndevice = "sim"\n')
    scenario = load_scenario(path, env={})
    managed = make_target(scenario, tmp_path)
    assert isinstance(managed, ManagedServer)
    assert managed.log_path == (tmp_path / "server" / "server.log").resolve()
    chosen = make_target(scenario, tmp_path, url="127.0.0.1:9000")
    assert isinstance(chosen, RemoteTarget) and chosen.url == "http://127.0.0.1:9000"
    path.write_text('[model]\nname = "m"\nurl = "http://127.0.0.1:9001"\n')
    assert make_target(load_scenario(path, env={}), tmp_path).url == "http://127.0.0.1:9001"


class FakeConnection:
    """An ``http.client.HTTPConnection`` that answers from ``reply`` (or raises it)."""

    def __init__(self, host: str, port: int, timeout_s: float, reply: object) -> None:
        self.address, self.timeout_s, self.reply = (host, port), timeout_s, reply
        self.sent: list[tuple[str, str, bytes | None, dict[str, str]]] = []
        self.closed = False

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> None:
        self.sent.append((method, path, body, headers))
        if isinstance(self.reply, BaseException):
            raise self.reply

    def getresponse(self) -> FakeConnection:
        return self

    @property
    def status(self) -> int:
        return 200

    def read(self) -> bytes:
        return b"ok"

    def close(self) -> None:
        self.closed = True


def test_keep_alive_transport_reuses_one_connection_per_thread_and_host() -> None:
    opened: list[FakeConnection] = []

    def connect(host: str, port: int, timeout_s: float, tls: object) -> http.client.HTTPConnection:
        assert tls is None  # plain http://
        opened.append(FakeConnection(host, port, timeout_s, None))
        return opened[-1]  # type: ignore[return-value]

    transport = KeepAliveTransport(connect)
    raw = Request("POST", URL + "/v2/models/m/infer?x=1", None, 3.0, b"\x01", {"A": "b"})
    assert transport.request(raw) == Response(200, b"ok")
    assert transport.request(Request("GET", URL + "/v2")).status == 200
    assert len(opened) == 1  # kept alive
    assert opened[0].sent == [
        ("POST", "/v2/models/m/infer?x=1", b"\x01", {"A": "b"}),
        ("GET", "/v2", None, {}),
    ]
    with ThreadPoolExecutor(1) as pool:  # another thread: its own connection
        pool.submit(transport.request, Request("GET", URL + "/v2")).result()
    transport.request(Request("POST", "http://other.invalid:9000/x", {"a": 1}))  # another host
    assert [c.address for c in opened] == [("server.invalid", 8000)] * 2 + [("other.invalid", 9000)]
    assert opened[2].sent[0][2:] == (b'{"a": 1}', {"Content-Type": "application/json"})
    # A connection that fails is closed; an http.client error is an OSError like the others.
    opened[0].reply = http.client.BadStatusLine("x")
    with pytest.raises(ConnectionError, match="x"):
        transport.request(Request("GET", URL + "/v2"))
    assert opened[0].closed
    transport.request(Request("GET", URL + "/v2"))
    assert len(opened) == 4  # a new one
    transport.close()
    assert all(c.closed for c in opened)


def test_raise_for_status_keeps_2xx_and_names_the_rest() -> None:
    assert Response(204).raise_for_status() == Response(204)
    with pytest.raises(HTTPStatusError, match=r"HTTP Error 503: busy$") as info:
        Response(503, b"busy\nmore").raise_for_status(URL)
    assert isinstance(info.value, OSError) and (info.value.status, info.value.url) == (503, URL)
