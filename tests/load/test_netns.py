"""Distributed load across two network namespaces: results merge exactly across a real link.

Two namespaces ("hosts") joined by a veth pair, addresses in a private /30 that exists only
inside them (neither namespace has any other interface but its own loopback, so nothing leaves
them). Host A runs the reference server, the Locust master (``LocustLoadGenerator`` expecting
two remote workers) and worker 1; host B runs worker 2, whose requests and whose messages to the
master cross the veth link. Each worker also keeps its own raw latencies per tick
(``tests/load/netns_driver.py``), so the test knows what each worker measured independently of
the master's merge: the merged request count must be the sum of the workers' counts and the
merged p50/p99/max must equal the HDR percentiles of the union of their latencies.

Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``, no
CAP_SYS_ADMIN). Bounded: one level of 2 x 1.5 s at 60 req/s, every child under a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from analyzer.measure.histograms import new_histogram, percentiles_us, record_us
from tests.support.servers import ReferenceProcess, write_sim_model

REPO_ROOT = Path(__file__).resolve().parents[2]
#: A /30 inside the namespaces only (the host's own routes never see it).
ADDR_A, ADDR_B, PREFIX = "10.231.17.1", "10.231.17.2", 30
MASTER_PORT = 5557  # a fresh namespace has every port free
RATE_RPS, WINDOW_S, WINDOWS = 60.0, 1.5, 2
CHILD_TIMEOUT_S = 120


@dataclass(frozen=True)
class Hosts:
    a: str
    b: str
    veth_b: str


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def hosts(spawns: None) -> Iterator[Hosts]:
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (Debian package iproute2): cannot make network namespaces")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
    tag = f"{os.getpid() % 100000}"
    h = Hosts(a=f"psweep-a{tag}", b=f"psweep-b{tag}", veth_b=f"psvb{tag}")
    veth_a = f"psva{tag}"
    made: list[str] = []
    try:
        for ns in (h.a, h.b):
            done = _ip("netns", "add", ns)
            if done.returncode != 0:
                pytest.skip(f"cannot create a network namespace here: {done.stderr.strip()}")
            made.append(ns)
        steps = [
            ("link", "add", veth_a, "type", "veth", "peer", "name", h.veth_b),
            ("link", "set", veth_a, "netns", h.a),
            ("link", "set", h.veth_b, "netns", h.b),
            ("-n", h.a, "addr", "add", f"{ADDR_A}/{PREFIX}", "dev", veth_a),
            ("-n", h.b, "addr", "add", f"{ADDR_B}/{PREFIX}", "dev", h.veth_b),
            ("-n", h.a, "link", "set", veth_a, "up"),
            ("-n", h.b, "link", "set", h.veth_b, "up"),
            ("-n", h.a, "link", "set", "lo", "up"),
            ("-n", h.b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(
                    f"cannot wire the namespaces (ip {' '.join(step)}): {done.stderr.strip()}"
                )
        yield h
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
            _ip("netns", "del", ns)


def _in(ns: str, *argv: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *argv],
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        **kwargs,
    )


def _tx_packets(ns: str, dev: str) -> int:
    done = _ip("-n", ns, "-s", "-j", "link", "show", "dev", dev)
    return int(json.loads(done.stdout)[0]["stats64"]["tx"]["packets"])


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


@pytest.mark.slow
def test_two_hosts_merge_exactly(hosts: Hosts) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="perfsweep-netns-"))
    write_sim_model(tmp / "models", "nsmodel", device_ms=4.0)
    procs: list[subprocess.Popen[str]] = []
    server = ReferenceProcess(
        tmp,
        repository=tmp / "models",
        args=("--model", "nsmodel", "--host", ADDR_A),
        device=None,
        launcher=("ip", "netns", "exec", hosts.a),
        startup_timeout_s=CHILD_TIMEOUT_S,
    )
    try:
        server.start()
        addresses = server.addresses
        assert addresses is not None and addresses.host == ADDR_A

        master = _in(
            hosts.a,
            "-m",
            "tests.load.netns_driver",
            "master",
            "--bind",
            ADDR_A,
            "--port",
            str(MASTER_PORT),
            "--url",
            addresses.http_url,
            "--metrics-url",
            addresses.metrics_url,
            "--model",
            "nsmodel",
            "--workers",
            "2",
            "--rate",
            str(RATE_RPS),
            "--window-s",
            str(WINDOW_S),
            "--windows",
            str(WINDOWS),
            stdout=subprocess.PIPE,
        )
        procs.append(master)
        tx_before = _tx_packets(hosts.b, hosts.veth_b)
        outs = {ns: tmp / f"worker-{ns}.json" for ns in (hosts.a, hosts.b)}
        workers = {}
        for index, ns in enumerate((hosts.a, hosts.b), start=1):
            workers[ns] = _in(
                ns,
                "-m",
                "tests.load.netns_driver",
                "worker",
                "--master-host",
                ADDR_A,
                "--master-port",
                str(MASTER_PORT),
                "--index",
                str(index),
                "--out",
                str(outs[ns]),
            )
            procs.append(workers[ns])
        stdout, _ = master.communicate(timeout=CHILD_TIMEOUT_S)
        assert master.returncode == 0, f"master failed ({master.returncode})"
        for ns, w in workers.items():  # the master's quit ends the workers
            assert w.wait(timeout=CHILD_TIMEOUT_S) == 0, f"worker in {ns} failed"
        tx_after = _tx_packets(hosts.b, hosts.veth_b)
        answer = json.loads(stdout.strip().splitlines()[-1])
        result, collected = answer["measurement"], answer["collected"]
        mine = {ns: json.loads(outs[ns].read_text())["segments"] for ns in outs}
    finally:
        _stop(procs)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    # The master collected once after the warm-up, then once per tick of the windows; each
    # worker cut one segment per collection (segment k = what collection k+1 received).
    n = len(collected)
    assert n >= 2 * WINDOWS
    for ns, segments in mine.items():
        assert len(segments) == n + 1, f"{ns}: {len(segments)} segments for {n} collections"
    for k in range(n):  # per collection: the master's merged count is the sum of the workers'
        assert collected[k] == sum(len(s[k]) for s in mine.values())
    measured = {ns: [x for seg in s[1:n] for x in seg] for ns, s in mine.items()}
    assert all(measured.values()), "both hosts generated load"
    assert result["request_count"] == sum(len(v) for v in measured.values())
    assert result["error_count"] == 0

    union = new_histogram()
    for latencies in measured.values():
        for latency_s in latencies:
            record_us(union, latency_s * 1e6)
    expected = percentiles_us(union, [50, 99, 100])
    assert result["p50_ms"] == pytest.approx(expected[50] / 1000.0, rel=1e-12)
    assert result["p99_ms"] == pytest.approx(expected[99] / 1000.0, rel=1e-12)
    assert result["max_ms"] == pytest.approx(expected[100] / 1000.0, rel=1e-12)
    # and HDR's 3 significant digits: within 0.1 % of the exact p99 of the raw union
    raw = sorted(x for v in measured.values() for x in v)
    exact_p99_ms = raw[max(int(0.99 * len(raw) + 0.5), 1) - 1] * 1000.0
    assert result["p99_ms"] == pytest.approx(exact_p99_ms, rel=2e-3)
    # host B's requests (and its ticks to the master) crossed the veth link
    assert tx_after - tx_before >= len(measured[hosts.b])
