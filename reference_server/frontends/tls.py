"""TLS for the gRPC listener: ``--grpc-use-ssl``, ``--grpc-use-ssl-mutual`` and their PEM files.

As in Triton 2.51: with TLS the gRPC port speaks TLS only (a plain-text client cannot connect);
``--grpc-server-cert`` and ``--grpc-server-key`` are the server's certificate chain and key;
``--grpc-root-cert`` is the CA that client certificates must be signed by. Mutual TLS requires
and verifies a client certificate at the handshake. HTTP and metrics stay plain text (Triton
has no TLS for them either).

Where Triton fails late or obscurely, this server refuses to start with a message naming the
flag: a missing or unreadable PEM file, a key that does not match the certificate (Triton: "failed
to start GRPC service: ... already in use"), and mutual TLS without a root certificate (Triton
starts and then fails every handshake).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reference_server.core.errors import Code, ServerError

if TYPE_CHECKING:
    import grpc


@dataclass(frozen=True)
class GrpcTls:
    """The PEM material of a TLS gRPC listener, read and checked.

    Attributes:
        certificate_chain: ``--grpc-server-cert``: the server's PEM certificate (chain).
        private_key: ``--grpc-server-key``: its PEM private key.
        root_certificates: ``--grpc-root-cert``: PEM CA certificates; ``None`` if not given.
        mutual: Require a client certificate signed by ``root_certificates``.
    """

    certificate_chain: bytes
    private_key: bytes
    root_certificates: bytes | None
    mutual: bool

    @classmethod
    def load(
        cls, server_cert: Path, server_key: Path, root_cert: Path | None, *, mutual: bool
    ) -> GrpcTls:
        """Read the PEM files and check that they make a usable server.

        Raises:
            ServerError: INVALID_ARG: a file cannot be read, the key does not belong to the
                certificate, the root certificate is not PEM, or mutual TLS has no root.
        """
        if mutual and root_cert is None:
            raise ServerError(
                "--grpc-use-ssl-mutual needs --grpc-root-cert: the PEM certificate of the CA "
                "that signs client certificates",
                Code.INVALID_ARG,
            )
        tls = cls(
            certificate_chain=_read("--grpc-server-cert", server_cert),
            private_key=_read("--grpc-server-key", server_key),
            root_certificates=None if root_cert is None else _read("--grpc-root-cert", root_cert),
            mutual=mutual,
        )
        # grpc would only say "cannot bind" about bad PEM data: let OpenSSL say what is wrong.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(server_cert, server_key)
        except ssl.SSLError as exc:
            raise ServerError(
                f"cannot use --grpc-server-cert {server_cert} with --grpc-server-key "
                f"{server_key}: {_reason(exc)}; pass a PEM certificate and its PEM private key",
                Code.INVALID_ARG,
            ) from None
        if root_cert is not None:
            try:
                context.load_verify_locations(cafile=root_cert)
            except ssl.SSLError as exc:
                raise ServerError(
                    f"cannot use --grpc-root-cert {root_cert}: {_reason(exc)}; pass a PEM CA "
                    "certificate",
                    Code.INVALID_ARG,
                ) from None
        return tls

    def server_credentials(self) -> grpc.ServerCredentials:
        """The credentials for ``grpc.aio.Server.add_secure_port``."""
        import grpc

        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.root_certificates,
            require_client_auth=self.mutual,
        )


def _read(flag: str, path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ServerError(
            f"cannot read {flag} {path} ({exc.strerror or exc}): pass a readable PEM file",
            Code.INVALID_ARG,
        ) from None


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's complaint, said plainly."""
    if exc.reason == "KEY_VALUES_MISMATCH":
        return "the key does not belong to the certificate"
    if exc.reason == "NO_CERTIFICATE_OR_CRL_FOUND":
        return "no PEM certificate in it"
    if exc.reason is None and "PEM lib" in str(exc):
        return "not a PEM certificate and key"
    return str(exc)


__all__ = ["GrpcTls"]
