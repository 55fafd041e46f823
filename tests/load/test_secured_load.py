"""`perfsweep load` against a secured server: gRPC with mutual TLS and a restricted inference
protocol (the reference server with Triton's flags), and HTTPS through nginx with a bearer
token; every request carries the headers, the client certificate opens the gRPC channel, and
the results file holds no secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.certs import Certificates, write_certificates
from tests.support.real_triton import identity_model_config
from tests.support.servers import ReferenceProcess
from tests.support.tls import TlsProxy

INFER_KEY = "planted-infer-key-90c1"
TOKEN = "planted-proxy-token-33e7"
MODEL = "identity"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return write_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def server(
    certs: Certificates, tmp_path_factory: pytest.TempPathFactory, spawns: None
) -> Iterator[ReferenceProcess]:
    args = (
        *certs.server_flags(mutual=True),
        f"--http-restricted-api=inference:infer-key={INFER_KEY}",
        f"--grpc-restricted-protocol=inference:infer-key={INFER_KEY}",
    )
    workdir = tmp_path_factory.mktemp("secured_reference")
    with ReferenceProcess(workdir, [identity_model_config()], args=args) as running:
        yield running


def perfsweep_load(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    output = tmp_path / "load.json"
    command = [
        sys.executable,
        "-c",
        "from analyzer.cli import main; main()",
        "load",
        "--model",
        MODEL,
        "--request-rate",
        "40",
        "--window-s",
        "1",
        "--max-windows",
        "3",
        "--warmup-s",
        "0.5",
        "--output",
        str(output),
        *flags,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )


def served(tmp_path: Path, done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = (tmp_path / "load.json").read_text()
    assert INFER_KEY not in text and TOKEN not in text
    (level,) = json.loads(text)["results"]
    assert level["request_count"] > 0
    return dict(level)


def test_grpc_with_a_client_certificate_and_the_inference_key(
    server: ReferenceProcess, certs: Certificates, tmp_path: Path
) -> None:
    done = perfsweep_load(
        tmp_path,
        "--protocol",
        "grpc",
        "--url",
        server.grpc_url,
        "--ssl-ca",
        str(certs.ca),
        "--ssl-cert",
        str(certs.client_cert),
        "--ssl-key",
        str(certs.client_key),
        "--header",
        f"triton-grpc-protocol-infer-key: {INFER_KEY}",
    )
    level = served(tmp_path, done)
    assert level["error_count"] == 0, level.get("errors")
    assert level["server"]["success_count"] >= level["request_count"] // 2


def test_grpc_without_the_key_has_every_inference_refused(
    server: ReferenceProcess, certs: Certificates, tmp_path: Path
) -> None:
    c = certs
    flags = (
        "--ssl-ca",
        str(c.ca),
        "--ssl-cert",
        str(c.client_cert),
        "--ssl-key",
        str(c.client_key),
    )
    done = perfsweep_load(tmp_path, "--protocol", "grpc", "--url", server.grpc_url, *flags)
    level = served(tmp_path, done)
    assert level["error_count"] == level["request_count"]
    assert any("restricted" in kind for kind in level["errors"]), level["errors"]


def test_grpc_without_a_client_certificate_stops_before_any_load(
    server: ReferenceProcess, certs: Certificates, tmp_path: Path
) -> None:
    done = perfsweep_load(
        tmp_path, "--protocol", "grpc", "--url", server.grpc_url, "--ssl-ca", str(certs.ca)
    )
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    error = " ".join(done.stderr.split())
    assert f"cannot reach {server.grpc_url} over grpc" in error, error
    assert "give --ssl-cert and --ssl-key" in error, error


def test_https_through_a_proxy_with_a_bearer_token(
    server: ReferenceProcess, certs: Certificates, tmp_path: Path
) -> None:
    assert server.addresses is not None
    with TlsProxy(server.http_url, TOKEN, certs, tmp_path / "nginx") as proxy:
        done = perfsweep_load(
            tmp_path,
            "--url",
            proxy.url,
            "--ssl-ca",
            str(certs.ca),
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--header",
            f"infer-key: {INFER_KEY}",
        )
        level = served(tmp_path, done)
        assert level["error_count"] == 0, level.get("errors")
        # The server's own view came through the proxy too (statistics over HTTPS).
        assert level["server"]["success_count"] >= level["request_count"] // 2
