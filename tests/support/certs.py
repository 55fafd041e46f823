"""Throwaway TLS material for tests: a CA, a server certificate, client certificates (trustme).

:func:`write_certificates` writes PEM files a server takes as ``--grpc-server-cert`` /
``--grpc-server-key`` / ``--grpc-root-cert`` and a ``tritonclient.grpc`` client as
``root_certificates`` / ``certificate_chain`` / ``private_key`` (paths, which tritonclient
reads). ``trustme`` is imported where used: it is a test extra, and a test that needs it skips
with the install command when it is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Certificates:
    """PEM files in one directory.

    Attributes:
        ca: the CA certificate that signed the server and client certificates.
        server_cert: the server's certificate, for ``127.0.0.1`` and ``localhost``.
        server_key: its private key.
        client_cert: a client certificate signed by ``ca``.
        client_key: its private key.
        stranger_cert: a client certificate signed by another CA (mutual TLS refuses it).
        stranger_key: its private key.
    """

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def server_flags(self, *, mutual: bool) -> tuple[str, ...]:
        """The ``tritonserver`` / ``python -m reference_server`` flags of a TLS gRPC port."""
        return (
            f"--grpc-use-ssl{'-mutual' if mutual else ''}=true",
            f"--grpc-server-cert={self.server_cert}",
            f"--grpc-server-key={self.server_key}",
            f"--grpc-root-cert={self.ca}",
        )

    def client(self, *, cert: bool = True, stranger: bool = False) -> dict[str, Any]:
        """``tritonclient.grpc.InferenceServerClient`` keyword arguments for a TLS client.

        Args:
            cert: present a client certificate.
            stranger: present the one from another CA instead of ``client_cert``.
        """
        kwargs: dict[str, Any] = {"ssl": True, "root_certificates": str(self.ca)}
        if cert:
            chain, key = (
                (self.stranger_cert, self.stranger_key)
                if stranger
                else (self.client_cert, self.client_key)
            )
            kwargs.update(certificate_chain=str(chain), private_key=str(key))
        return kwargs


def write_certificates(directory: Path) -> Certificates:
    """A fresh CA with server and client certificates, written into ``directory``.

    Skips the calling test when ``trustme`` is not installed.
    """
    trustme: Any = pytest.importorskip("trustme", reason="pip install trustme (test extra)")
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@perfsweep.test")
    stranger = trustme.CA().issue_cert("stranger@perfsweep.test")
    files = Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        stranger_cert=directory / "stranger.pem",
        stranger_key=directory / "stranger.key",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    for issued, cert_path, key_path in (
        (server, files.server_cert, files.server_key),
        (client, files.client_cert, files.client_key),
        (stranger, files.stranger_cert, files.stranger_key),
    ):
        # The leaf first, then any intermediates: a PEM chain as servers and clients expect.
        cert_path.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(key_path))
    return files
