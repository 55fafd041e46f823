"""Run load-engine scenarios in a child process, so the test process is never gevent-patched.

``run_driver(spec)`` (called by tests) starts ``python -m tests.load.driver`` with a JSON spec on
stdin; the child starts a reference server with one simulated model (``RefServer``), runs the
requested levels through ``LocustLoadGenerator`` (optionally pausing the simulated device during a
level), and prints the measurements as JSON on its last stdout line.

Spec keys: ``model`` (kwargs of ``write_sim_model`` minus the repository), ``protocol``,
``workers``, ``levels`` (list of ``LoadSpec`` fields plus an optional ``pause_after_s`` /
``pause_s``, or ``unload_after_s``: unload the model mid-level), ``pool_size``, ``retry_invalid`` (measure a level again, once, when the generator was starved),
``capacity`` (``CapacitySpec`` fields, optional), ``precise_timer`` (false: the dispatcher sleeps
on gevent's timers). A level with ``host_timer: true`` is measured beside a bare timer ticking at
its target rate (``tests.load.host_timer``): its answer's ``host_late_share_1ms`` is the share of
that timer's ticks that woke over 1 ms late, the host's part of any send lag.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.load.child import run_module


def run_driver(spec: dict[str, Any], timeout_s: float = 240.0) -> dict[str, Any]:
    """Run ``spec`` in a child process and return its JSON answer."""
    return run_module("tests.load.driver", stdin=json.dumps(spec), timeout_s=timeout_s)


def _level(data: dict[str, Any]) -> Any:
    from analyzer.measure.arrivals import ArrivalProcess
    from analyzer.measure.specs import LoadMode, LoadSpec

    fields = {k: v for k, v in data.items() if not k.startswith(("pause", "unload", "host"))}
    fields["mode"] = LoadMode(fields["mode"])
    if "arrival" in fields:
        fields["arrival"] = ArrivalProcess.from_dict(fields["arrival"])
    return LoadSpec(**fields)


def _unload(http_url: str, model: str) -> None:
    import urllib.request

    request = urllib.request.Request(
        f"http://{http_url}/v2/repository/models/{model}/unload", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def main() -> None:
    """Child side: read the spec, run it, print the answer."""
    spec = json.loads(sys.stdin.read())
    started = time.monotonic()

    def phase(text: str) -> None:  # timings on stderr: shown when a test fails
        print(f"[driver {time.monotonic() - started:6.2f}s] {text}", file=sys.stderr, flush=True)

    import gevent

    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.measure.specs import CapacitySpec, Goals
    from tests.load.host_timer import HostTimer
    from tests.load.refserver import RefServer, write_sim_model

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-load-"))
    model = spec["model"]
    write_sim_model(repo, **model)
    answer: dict[str, Any] = {"levels": []}
    phase("imported")
    with RefServer(repo, (model["name"],)) as srv:
        phase(f"server ready at {srv.http_url}")
        protocol = spec.get("protocol", "http")
        options = EngineOptions(
            url=srv.grpc_url if protocol == "grpc" else srv.http_url,
            model=model["name"],
            protocol=protocol,
            workers=spec.get("workers", 1),
            pool_size=spec.get("pool_size", 512),
            metrics_url=srv.metrics_url,
            precise_timer=spec.get("precise_timer", True),
        )
        with LocustLoadGenerator(options) as generator:
            for level in spec.get("levels", []):
                pause = None
                if "pause_after_s" in level:
                    pause = gevent.spawn_later(
                        level["pause_after_s"], srv.pause, model["name"], level["pause_s"]
                    )
                if "unload_after_s" in level:
                    gevent.spawn_later(
                        level["unload_after_s"], _unload, srv.http_url, model["name"]
                    )
                with contextlib.ExitStack() as beside:
                    host = HostTimer(level["target"]) if level.get("host_timer") else None
                    if host is not None:
                        beside.enter_context(host)
                    m = generator.measure(_level(level))
                if not m.valid and spec.get("retry_invalid"):
                    # the shared machine starved the generator: that level says nothing yet
                    phase(f"invalid, measuring again: {m.messages[0]}")
                    generator.drain(30.0)
                    m = generator.measure(_level(level))
                record = m.to_dict()
                if host is not None:
                    record["host_late_share_1ms"] = host.late_share
                answer["levels"].append(record)
                phase(f"measured {level['mode']} {level['target']}")
                if pause is not None:
                    pause.join()
                generator.drain(30.0)
            if "capacity" in spec:
                cap = dict(spec["capacity"])
                cap["goals"] = Goals(**cap["goals"])
                cap["step"] = _level(cap["step"])
                answer["capacity"] = generator.find_capacity(CapacitySpec(**cap)).to_dict()
                phase("capacity search done")
        phase("generator closed")
    phase("server stopped")
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
