"""A real nginx that terminates HTTPS and checks a bearer token in front of a server on
loopback: :class:`TlsProxy` starts ``nginx`` from the distribution's package (``.ci/run``
installs it) with a configuration of its own in a scratch directory, on a free loopback port,
with a certificate of :func:`tests.support.certs.write_certificates`, and stops it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.certs import Certificates
from tests.support.servers import free_port


def nginx_binary() -> str:
    """The ``nginx`` binary; the test is skipped with a reason when it is not installed."""
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("nginx is not installed (apt-get install nginx; .ci/run does)")
    raise AssertionError  # unreachable: skip raises


_CONFIG = """\
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    client_max_body_size 64m;
    upstream triton {{ server {upstream}; keepalive 64; }}
    server {{
        {listen}
        location / {{
            if ($http_authorization != "Bearer {token}") {{ return 401 "missing or wrong token\\n"; }}
            proxy_pass http://triton;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


@dataclass
class TlsProxy:
    """nginx on ``127.0.0.1:<free port>``: HTTPS with ``certificates``' server certificate,
    ``Authorization: Bearer <token>`` required on every request (401 otherwise), the rest
    passed to ``upstream`` (``host:port``) over keep-alive HTTP.

    Args:
        upstream: The server behind it.
        token: The bearer token it accepts.
        certificates: The server certificate it presents (and the CA of client certificates
            with ``verify_clients``).
        workdir: Its configuration, logs and temporary files.
        verify_clients: Require a client certificate signed by the CA (mutual TLS).
        tls: False: plain HTTP with the same token check and upstream (the benchmarks' twin
            of the TLS proxy).
    """

    upstream: str
    token: str
    certificates: Certificates
    workdir: Path
    verify_clients: bool = False
    tls: bool = True
    port: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` (``http://`` without TLS)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> TlsProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 20.0) -> None:
        """Write the configuration, start nginx and wait until it answers TLS."""
        binary = nginx_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        c = self.certificates
        listen = f"listen 127.0.0.1:{self.port};"
        if self.tls:
            listen = (
                f"listen 127.0.0.1:{self.port} ssl; ssl_certificate {c.server_cert}; "
                f"ssl_certificate_key {c.server_key};"
            )
            if self.verify_clients:
                listen += f" ssl_client_certificate {c.ca}; ssl_verify_client on;"
        config = self.workdir / "nginx.conf"
        config.write_text(
            _CONFIG.format(
                root=self.workdir,
                upstream=self.upstream,
                listen=listen,
                token=self.token,
            )
        )
        log = (self.workdir / "nginx.out").open("ab")
        self._process = subprocess.Popen(
            [
                binary,
                "-p",
                str(self.workdir),
                "-c",
                str(config),
                "-e",
                str(self.workdir / "error.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"nginx exited {self._process.returncode}:\n{self.log_tail()}")
            if self._answers():
                return
            time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer in {timeout_s:g} s:\n{self.log_tail()}")

    def _answers(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        """Stop nginx (its workers with it)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of nginx's error log and output."""
        text = ""
        for name in ("error.log", "nginx.out"):
            path = self.workdir / name
            if path.is_file():
                text += f"--- {name}\n{path.read_text(errors='replace')[-chars:]}"
        return text


__all__ = ["TlsProxy", "nginx_binary"]
