"""Generator capacity: requests/s per core of the perfsweep load generator, beside raw clients.

One stub KServe v2 server (HTTP + gRPC, canned responses, so it costs almost nothing per request)
runs pinned to the last core; every client runs in its own process pinned to core 0, one after
the other, against the same model and the same request body (one FP32 1x16 tensor, binary
tensor extension):

* ``raw geventhttpclient``: C greenlets looping ``HTTPClient.request`` on the pre-serialised body
  (the ceiling for a Python/gevent client);
* ``wrk``: the C load generator (Debian package), POSTing the same body from a Lua script;
* ``perfsweep``: ``LocustLoadGenerator`` (Locust users, exact HDR recording), HTTP and gRPC,
  closed loop (concurrency C) and open loop (a ladder of request rates).

Throughput per core = completed requests / CPU seconds the client process used in the measured
interval (so a busy machine changes wall-clock rates but much less the per-core figures).
Open-loop rungs also report perfsweep's own verdict: the generator's saturation point is the
highest rate it still calls valid (CPU <= 90 % of a core and <= 1 % of requests sent more than
10 ms late); above it every result is flagged invalid.

Goal: perfsweep HTTP closed loop >= 50 % of raw geventhttpclient per core.

Usage (repository root)::

    .venv/bin/python benchmarks/generator_capacity.py                # 5 s per client
    .venv/bin/python benchmarks/generator_capacity.py --duration-s 3 --rates 500,1000,2000

Prints a markdown table and writes ``benchmarks/results/generator_capacity-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "m"
METADATA = {
    "name": MODEL,
    "versions": ["1"],
    "platform": "stub",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}],
}
CONFIG = {"name": MODEL, "max_batch_size": 0, "input": [], "output": []}


# ---------------------------------------------------------------------------------------------
# The stub server (its own process): asyncio HTTP/1.1 keep-alive + grpc.aio, canned answers.


def _infer_response() -> tuple[bytes, int]:
    header = json.dumps(
        {
            "model_name": MODEL,
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "FP32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
            ],
        }
    ).encode()
    return header + bytes(64), len(header)


class _HttpStub(asyncio.Protocol):
    INFER, INFER_HEADER_LEN = _infer_response()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            request_line = head[0].split(" ")
            if len(request_line) < 3:  # not HTTP/1.x (e.g. an HTTP/2 preface): hang up
                self.transport.close()
                return
            self._answer(request_line[0], request_line[1])

    def _answer(self, method: str, path: str) -> None:
        extra = ""
        status = "200 OK"
        if method == "POST" and path.endswith("/infer"):
            body = self.INFER
            extra = f"Inference-Header-Content-Length: {self.INFER_HEADER_LEN}\r\n"
        elif path.endswith("/ready") or path.startswith("/v2/health"):
            body = b""
        elif path == f"/v2/models/{MODEL}":
            body = json.dumps(METADATA).encode()
        elif path == f"/v2/models/{MODEL}/config":
            body = json.dumps(CONFIG).encode()
        elif path.endswith("/stats"):
            body = json.dumps({"model_stats": []}).encode()
        else:
            status, body = "404 Not Found", b'{"error":"not found"}'
        head = (
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: application/octet-stream\r\n{extra}\r\n"
        )
        assert isinstance(self.transport, asyncio.Transport)
        self.transport.write(head.encode() + body)


async def _serve_stub() -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    class Grpc(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]
            return service_pb2.ServerLiveResponse(live=True)

        async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
            return service_pb2.ModelReadyResponse(ready=True)

        async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]
            t = service_pb2.ModelMetadataResponse.TensorMetadata
            return service_pb2.ModelMetadataResponse(
                name=MODEL,
                versions=["1"],
                platform="stub",
                inputs=[t(name="INPUT0", datatype="FP32", shape=[1, 16])],
                outputs=[t(name="OUTPUT0", datatype="FP32", shape=[1, 16])],
            )

        async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]
            return service_pb2.ModelConfigResponse()

        async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]
            return service_pb2.ModelStatisticsResponse()

        async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
            out = service_pb2.ModelInferResponse.InferOutputTensor(
                name="OUTPUT0", datatype="FP32", shape=[1, 16]
            )
            return service_pb2.ModelInferResponse(
                model_name=MODEL, outputs=[out], raw_output_contents=[bytes(64)]
            )

    loop = asyncio.get_running_loop()
    http = await loop.create_server(_HttpStub, "127.0.0.1", 0)
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Grpc(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    http_port = http.sockets[0].getsockname()[1]
    print(f"ready http=127.0.0.1:{http_port} grpc=127.0.0.1:{grpc_port}", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await server.stop(0)
    http.close()


# ---------------------------------------------------------------------------------------------
# Clients (each its own process, pinned by the parent).


def _request_body() -> tuple[bytes, dict[str, str]]:
    import numpy as np
    import tritonclient.http as httpclient

    t = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    t.set_data_from_numpy(np.zeros((1, 16), np.float32), binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    body, json_len = httpclient.InferenceServerClient.generate_request_body([t], outputs=[out])
    return bytes(body), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(json_len),
    }


def _client_raw(url: str, concurrency: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    import gevent
    from geventhttpclient import HTTPClient

    host, port = url.rsplit(":", 1)
    body, headers = _request_body()
    client = HTTPClient(host, int(port), concurrency=concurrency)
    count = [0]
    path = f"/v2/models/{MODEL}/infer"

    def loop() -> None:
        while True:
            with client.request("POST", path, body=body, headers=headers) as resp:
                resp.read()
            count[0] += 1

    workers = [gevent.spawn(loop) for _ in range(concurrency)]
    gevent.sleep(warmup_s)
    n0, cpu0, t0 = count[0], time.process_time(), time.monotonic()
    gevent.sleep(duration_s)
    n1, cpu1, t1 = count[0], time.process_time(), time.monotonic()
    gevent.killall(workers)
    return {"requests": n1 - n0, "wall_s": t1 - t0, "cpu_s": cpu1 - cpu0}


def _client_perfsweep(
    url: str, protocol: str, mode: str, target: float, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.measure.specs import Arrival, LoadMode, LoadSpec

    spec = LoadSpec(
        LoadMode(mode),
        target,
        arrival=Arrival.POISSON,
        warmup_s=warmup_s,
        window_s=duration_s,
        max_windows=1,
        stable_windows=1,
    )
    options = EngineOptions(url=url, model=MODEL, protocol=protocol, scrape_server=False)
    with LocustLoadGenerator(options) as generator:
        m = generator.measure(spec)
    cpu_s = m.generator_cpu_pct / 100.0 * m.duration_s
    return {
        "requests": m.request_count,
        "wall_s": m.duration_s,
        "cpu_s": cpu_s,
        "valid": m.valid,
        "send_lag_p99_ms": m.send_lag_p99_ms,
        "p99_ms": m.p99_ms,
        "offered_rps": m.offered_rps,
        "messages": list(m.messages),
    }


# ---------------------------------------------------------------------------------------------
# The parent: start the stub, run every client pinned, tabulate.


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") else []


def _run_child(args: list[str], core: int, timeout_s: float) -> dict[str, Any]:
    proc = subprocess.Popen(
        [*_pin(core), sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    out, _ = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"client {args} failed with {proc.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _run_wrk(url: str, concurrency: int, duration_s: float, core: int) -> dict[str, Any] | None:
    if shutil.which("wrk") is None:
        return None
    body, headers = _request_body()
    workdir = Path(tempfile.mkdtemp(prefix="wrk-"))
    (workdir / "body.bin").write_bytes(body)
    header_lines = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    (workdir / "post.lua").write_text(
        'wrk.method = "POST"\n'
        f'local f = io.open("{workdir / "body.bin"}", "rb")\n'
        'wrk.body = f:read("*all")\nf:close()\n' + header_lines
    )
    proc = subprocess.Popen(
        [
            *_pin(core),
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{int(duration_s)}s",
            "-s",
            str(workdir / "post.lua"),
            f"http://{url}/v2/models/{MODEL}/infer",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    _, _status, usage = os.wait4(proc.pid, 0)  # rusage: wrk's own CPU time
    out = proc.stdout.read() if proc.stdout else ""
    requests = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] == "requests" and parts[0].isdigit():
            requests = int(parts[0])
    return {
        "requests": requests,
        "wall_s": float(int(duration_s)),
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main() -> None:
    """Parse flags, run the benchmark, print and save the table."""
    if len(sys.argv) > 1 and sys.argv[1] == "stub":
        asyncio.run(_serve_stub())
        return
    if len(sys.argv) > 1 and sys.argv[1] == "raw":
        print(json.dumps(_client_raw(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), 1.0)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "perfsweep":
        url, protocol, mode, target, duration = sys.argv[2:7]
        print(
            json.dumps(_client_perfsweep(url, protocol, mode, float(target), float(duration), 1.0))
        )
        return

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rates", default="500,1000,2000,3000,4000", help="open-loop ladder")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    client_core, server_core = 0, cores - 1

    stub = subprocess.Popen(
        [*_pin(server_core), sys.executable, __file__, "stub"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert stub.stdout is not None and stub.stdin is not None
    ready = stub.stdout.readline().split()
    http_url = ready[1].split("=", 1)[1]
    grpc_url = ready[2].split("=", 1)[1]
    rows: list[dict[str, Any]] = []
    timeout = args.duration_s * 4 + 60
    d, c = str(args.duration_s), args.concurrency
    try:

        def add(
            client: str, protocol: str, loop: str, target: str, r: dict[str, Any] | None
        ) -> None:
            if r is None:
                return
            r.update(client=client, protocol=protocol, loop=loop, target=target)
            r["rps"] = r["requests"] / r["wall_s"] if r["wall_s"] else 0.0
            r["rps_per_core"] = r["requests"] / r["cpu_s"] if r["cpu_s"] else 0.0
            rows.append(r)
            print(
                f"{client:24} {protocol:4} {loop:6} {target:>6}: {r['rps']:8.0f} req/s, "
                f"{r['rps_per_core']:8.0f} req/s per core"
                + ("" if r.get("valid", True) else "  (perfsweep: INVALID)"),
                file=sys.stderr,
            )

        add(
            "raw geventhttpclient",
            "http",
            "closed",
            f"c={c}",
            _run_child(["raw", http_url, str(c), d], client_core, timeout),
        )
        add("wrk", "http", "closed", f"c={c}", _run_wrk(http_url, c, args.duration_s, client_core))
        for protocol, url in (("http", http_url), ("grpc", grpc_url)):
            add(
                "perfsweep",
                protocol,
                "closed",
                f"c={c}",
                _run_child(
                    ["perfsweep", url, protocol, "concurrency", str(c), d], client_core, timeout
                ),
            )
            for rate in args.rates.split(","):
                add(
                    "perfsweep",
                    protocol,
                    "open",
                    f"{rate}/s",
                    _run_child(
                        ["perfsweep", url, protocol, "request_rate", rate, d], client_core, timeout
                    ),
                )
    finally:
        stub.stdin.close()
        stub.wait(timeout=10)

    raw = next(r for r in rows if r["client"] == "raw geventhttpclient")
    lines = [
        "| client | protocol | loop | target | req/s | req/s per core | vs raw (per core) | valid | send-lag p99 ms |",
        "|---|---|---|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['client']} | {r['protocol']} | {r['loop']} | {r['target']} | {r['rps']:.0f} | "
            f"{r['rps_per_core']:.0f} | {r['rps_per_core'] / raw['rps_per_core']:.0%} | "
            f"{'yes' if r.get('valid', True) else 'no'} | "
            f"{r['send_lag_p99_ms']:.1f} |"
            if "send_lag_p99_ms" in r
            else f"| {r['client']} | {r['protocol']} | {r['loop']} | {r['target']} | {r['rps']:.0f} | "
            f"{r['rps_per_core']:.0f} | {r['rps_per_core'] / raw['rps_per_core']:.0%} | - | - |"
        )
    # Two saturation points per protocol: the highest open-loop rung perfsweep itself called
    # valid (noisy on a shared machine: lag also counts other processes' CPU), and the rate at
    # which the generator would reach the 90 % CPU limit, from its CPU cost per request.
    saturation: dict[str, dict[str, float]] = {}
    for protocol in ("http", "grpc"):
        rungs = [
            r
            for r in rows
            if r["client"] == "perfsweep" and r["protocol"] == protocol and r["loop"] == "open"
        ]
        valid = [float(r["target"][:-2]) for r in rungs if r.get("valid")]
        per_core = max((r["rps_per_core"] for r in rungs), default=0.0)
        saturation[protocol] = {
            "highest_valid_rung_rps": max(valid, default=0.0),
            "cpu_limit_rps": 0.9 * per_core,
        }
    print("\n".join(lines))
    for protocol, sat in saturation.items():
        print(
            f"{protocol}: open-loop saturation per generator process: highest valid rung "
            f"{sat['highest_valid_rung_rps']:g} req/s; 90 % CPU reached at about "
            f"{sat['cpu_limit_rps']:.0f} req/s"
        )
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "benchmarks" / "results" / f"generator_capacity-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "generator_capacity",
                "host": platform.node(),
                "cpu_count": cores,
                "python": platform.python_version(),
                "load_average": os.getloadavg(),
                "duration_s": args.duration_s,
                "rows": rows,
                "saturation_rps": saturation,
                "max_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
            },
            indent=2,
        )
    )
    print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
