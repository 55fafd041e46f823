"""`perfsweep run` tunes a secured real Triton and writes no secret down.

One Triton 2.51 for the module: gRPC with mutual TLS (``--grpc-use-ssl-mutual``, certificates
from a throwaway CA) and the repository API restricted on both protocols to callers with an
``admin-key`` header. In front of its HTTP port, a real nginx terminates HTTPS and checks a
bearer token. The sweep reaches it as a user would, by both paths at once: the HTTP API through
the proxy with ``--url https://``, the load over gRPC with the client certificate and the header;
every file of its run directory is searched for the planted secrets. Without the header, or
with a wrong token, the run stops before its first trial with exit 2 and a message naming the
API and the flag.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.rundir.results import load_summary
from tests.support.certs import Certificates, write_certificates
from tests.support.real_triton import RealTriton, TritonInstall, sleep_model_config
from tests.support.sweeps import small_scenario
from tests.support.tls import TlsProxy

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MODEL = "secured_sleep"
#: Planted secrets: the repository API's key and the proxy's token.
ADMIN_KEY = "planted-admin-key-7f3e9c"
TOKEN = "planted-bearer-token-51ad2b"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return write_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secured_triton(
    triton_install: TritonInstall,
    certificates: Certificates,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealTriton]:
    c = certificates
    triton = RealTriton(
        triton_install,
        tmp_path_factory.mktemp("secured_triton"),
        models=[
            sleep_model_config(
                MODEL, max_batch_size=8, execute_delay_ms=4.0, execute_delay_ms_per_item=0.5
            )
        ],
        extra_args=[
            *c.server_flags(mutual=True),
            f"--http-restricted-api=model-repository:admin-key={ADMIN_KEY}",
            f"--grpc-restricted-protocol=model-repository:admin-key={ADMIN_KEY}",
        ],
    )
    triton.start()
    try:
        yield triton
    finally:
        triton.stop()


@pytest.fixture(scope="module")
def proxy(
    secured_triton: RealTriton, certificates: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsProxy]:
    with TlsProxy(
        secured_triton.http_url, TOKEN, certificates, tmp_path_factory.mktemp("nginx")
    ) as running:
        yield running


def served_config(triton: RealTriton) -> mc.ModelConfig:
    status, payload = triton.http_status("GET", f"/v2/models/{MODEL}/config")
    assert status == 200, payload
    return json_format.Parse(payload, mc.ModelConfig(), ignore_unknown_fields=True)


def perfsweep_run(
    tmp_path: Path, run_dir: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    scenario = tmp_path / "s.toml"
    scenario.write_text(small_scenario(2, max_rate_rps=400.0, validate_top=0))
    command = [
        sys.executable,
        "-c",
        "from analyzer.cli import main; main()",
        "run",
        "--scenario",
        str(scenario),
        "--model",
        MODEL,
        "--run-dir",
        str(run_dir),
        *flags,
    ]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    child_env.update(env or {})
    return subprocess.run(command, capture_output=True, text=True, timeout=280, env=child_env)


def files_holding(root: Path, *secrets: str) -> list[str]:
    """Every file under ``root`` whose bytes hold one of ``secrets``."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path}: {s}" for s in secrets if s.encode() in data]
    return found


def over_grpc(triton: RealTriton, c: Certificates, *, client_cert: bool = True) -> list[str]:
    """The flags of a sweep that loads ``triton`` over mutual-TLS gRPC (its HTTP side plain)."""
    flags = ["--url", f"http://{triton.http_url}", "--protocol", "grpc"]
    flags += ["--grpc-url", triton.grpc_url, "--ssl-ca", str(c.ca)]
    if client_cert:
        flags += ["--ssl-cert", str(c.client_cert), "--ssl-key", str(c.client_key)]
    return flags


@pytest.mark.usefixtures("live_sweep")
def test_a_sweep_through_a_tls_proxy_with_a_token_loading_over_mutual_tls_grpc(
    secured_triton: RealTriton, proxy: TlsProxy, certificates: Certificates, tmp_path: Path
) -> None:
    """The live sweep of a secured Triton, every secured path at once: its HTTP API (health,
    repository, statistics) through the HTTPS proxy with a bearer token, the repository API's
    key from a header file, the load over gRPC with mutual TLS. The shared server gets its
    original config back through the restricted repository API; no secret is written down."""
    original = served_config(secured_triton)
    c = certificates
    headers = tmp_path / "headers.txt"
    headers.write_text(f"# the repository API's key\nadmin-key: {ADMIN_KEY}\n")
    run_dir = tmp_path / "run"
    done = perfsweep_run(
        tmp_path,
        run_dir,
        *("--url", proxy.url, "--ssl-ca", str(c.ca), "--header-file", str(headers)),
        *("--protocol", "grpc", "--grpc-url", secured_triton.grpc_url),
        *("--ssl-cert", str(c.client_cert), "--ssl-key", str(c.client_key)),
        # A token given on the command line: recorded as <redacted>.
        *("--header", "Authorization: Bearer ${TOKEN}"),
        env={"TOKEN": TOKEN},
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["trials"]["total"] == 2 and summary["trials"]["complete"] == 2
    assert summary["best"] is not None
    # The load went over gRPC with TLS: requests were served, none failed.
    assert summary["best"]["throughput_rps"] > 0
    assert summary["scenario"]["model"]["protocol"] == "grpc"
    target = summary["environment"]["target"]
    assert target["url"] == proxy.url
    assert sorted(target["access"]["headers"]) == ["Authorization", "admin-key"]
    assert target["access"]["client_certificate"] is True
    # The shared server got its original config back through the restricted repository API.
    assert served_config(secured_triton) == original
    assert summary["left_on_server"]["config"] == "original"
    assert files_holding(run_dir, ADMIN_KEY, TOKEN) == []
    command = " ".join(json.loads((run_dir / "run.json").read_text())["command"])
    assert "Authorization: <redacted>" in command or "${TOKEN}" in command, command


def test_without_the_repository_key_the_run_stops_before_any_trial(
    secured_triton: RealTriton, certificates: Certificates, tmp_path: Path
) -> None:
    c = certificates
    run_dir = tmp_path / "run"
    done = perfsweep_run(
        tmp_path,
        run_dir,
        *over_grpc(secured_triton, c),
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    error = " ".join(done.stderr.split())
    assert "refused the model-repository API" in error, error
    assert "expects the header 'admin-key'" in error and "--header" in error, error
    assert not (run_dir / "trials.csv").exists()  # no trial ran


def test_a_wrong_token_stops_the_run_before_any_trial(
    proxy: TlsProxy, certificates: Certificates, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    done = perfsweep_run(
        tmp_path,
        run_dir,
        "--url",
        proxy.url,
        "--ssl-ca",
        str(certificates.ca),
        "--header",
        "Authorization: Bearer not-the-token",
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    error = " ".join(done.stderr.split())
    assert "the server refused the health API (HTTP 401" in error, error
    assert "Authorization" in error
    assert not (run_dir / "trials.csv").exists()


def test_without_a_client_certificate_the_run_stops_before_any_trial(
    secured_triton: RealTriton, certificates: Certificates, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    done = perfsweep_run(
        tmp_path,
        run_dir,
        *over_grpc(secured_triton, certificates, client_cert=False),
        "--header",
        "admin-key: ${ADMIN_KEY}",
        env={"ADMIN_KEY": ADMIN_KEY},
    )
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    error = " ".join(done.stderr.split())
    assert f"cannot reach {secured_triton.grpc_url} over grpc" in error, error
    assert "give --ssl-cert and --ssl-key" in error, error
    assert not (run_dir / "trials.csv").exists()
