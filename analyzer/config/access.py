"""How perfsweep reaches a secured server: TLS and request headers, never written down.

A :class:`ServerAccess` holds the certificate files (``--ssl-ca``, ``--ssl-cert``,
``--ssl-key``, ``--ssl-insecure``) and the headers (``--header``, ``--header-file``) every
request carries: inference, statistics, metrics and the repository API, over HTTP and as gRPC
metadata. Each client turns it into what its library takes: :meth:`ServerAccess.ssl_context`
(the standard library, gevent sockets), :meth:`ServerAccess.grpc_options` (tritonclient.grpc),
:meth:`ServerAccess.http_headers`.

When TLS is used: HTTP when the URL is ``https://``; gRPC when a CA, a client certificate or
``--ssl-insecure`` is given (Triton serves TLS on gRPC only, so a secured Triton pairs a plain
``http://`` URL with TLS on gRPC).

Secrets stay in memory: a header value is read from the flag, from ``${VAR}`` in it (the
environment) or from a file; :meth:`ServerAccess.describe` is what records keep (that TLS, a
client certificate or a header was used, and the header's name), and :func:`redact_command`
takes the values out of a recorded command line. The scenario holds the headers in a field that
is never dumped (:class:`analyzer.config.sections.ModelSection`).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.errors import AccessDeniedError, InputError

#: ``${NAME}`` in a header value: the value of environment variable NAME.
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
#: Triton's refusal of a restricted API names the header it expects.
_EXPECTED_HEADER = re.compile(r"expecting header '([^']+)'")
#: What a recorded command line shows instead of a header's value.
REDACTED = "<redacted>"


@dataclass(frozen=True)
class Header:
    """One request header; its value is a secret (never in ``repr``)."""

    name: str
    value: str = field(repr=False)


def parse_header(
    text: str, environ: Mapping[str, str] | None = None, where: str = "--header"
) -> Header:
    """``Name: value`` as a :class:`Header`, each ``${VAR}`` in the value replaced by the
    environment's VAR (so a token never has to be written on a command line).

    Raises:
        InputError: no ``:``, a name that is not an HTTP token, an unset variable.
    """
    env = os.environ if environ is None else environ
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _HEADER_NAME.match(name):
        raise InputError(f"{where}: expected 'Name: value', got a header named {name!r}")

    def substitute(match: re.Match[str]) -> str:
        variable = match.group(1)
        if variable not in env:
            raise InputError(f"{where} {name}: environment variable {variable} is not set")
        return env[variable]

    return Header(name, _ENV_REFERENCE.sub(substitute, value))


def read_header_file(path: Path, environ: Mapping[str, str] | None = None) -> list[Header]:
    """The headers of a file, one ``Name: value`` per line (``#`` comments and blank lines
    skipped; ``${VAR}`` as in :func:`parse_header`).

    Raises:
        InputError: the file cannot be read or a line is not a header.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise InputError(f"--header-file {path}: {exc.strerror or exc}") from None
    return [
        parse_header(line, environ, where=f"--header-file {path}:{number}")
        for number, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def collect_headers(
    headers: Sequence[str] | None,
    header_files: Sequence[Path] | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[tuple[str, str], ...] | None:
    """The ``--header`` and ``--header-file`` flags as ``(name, value)`` pairs for the
    scenario's ``model.headers`` (None when neither was given)."""
    if not headers and not header_files:
        return None
    found = [h for path in header_files or () for h in read_header_file(path, environ)]
    found += [parse_header(text, environ) for text in headers or ()]
    return tuple((h.name, h.value) for h in found)


@dataclass(frozen=True)
class ServerAccess:
    """TLS files and headers for every request to the server under test.

    Attributes:
        ssl_ca: CA bundle that signs the server's certificate (None: the system's).
        ssl_cert: Client certificate (PEM) for mutual TLS.
        ssl_key: The client certificate's private key (None: inside ``ssl_cert``).
        ssl_insecure: Do not verify the server's certificate (self-signed test servers).
        headers: Sent with every request.
    """

    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    ssl_insecure: bool = False
    headers: tuple[Header, ...] = ()

    @property
    def grpc_tls(self) -> bool:
        """Whether gRPC speaks TLS (a CA, a client certificate or ``--ssl-insecure`` given)."""
        return bool(self.ssl_ca or self.ssl_cert or self.ssl_insecure)

    def __bool__(self) -> bool:
        return self.grpc_tls or bool(self.headers)

    def check(self) -> ServerAccess:
        """This access once its files are readable and make a TLS context.

        Raises:
            InputError: a missing file, a key without a certificate, a certificate the key does
                not match, or ``--ssl-insecure`` beside ``--ssl-ca``.
        """
        for flag, path in (("--ssl-ca", self.ssl_ca), ("--ssl-cert", self.ssl_cert)):
            if path is not None and not Path(path).is_file():
                raise InputError(f"{flag} {path}: no such file")
        if self.ssl_key is not None and not Path(self.ssl_key).is_file():
            raise InputError(f"--ssl-key {self.ssl_key}: no such file")
        if self.ssl_key and not self.ssl_cert:
            raise InputError("--ssl-key needs --ssl-cert (the client certificate it signs)")
        if self.ssl_insecure and self.ssl_ca:
            raise InputError("--ssl-insecure skips the check that --ssl-ca is for: give one")
        if self.grpc_tls:
            self.ssl_context()
        return self

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the server checked against ``ssl_ca`` (or the system's CAs;
        nothing with ``ssl_insecure``), ``ssl_cert`` presented when the server asks.

        Raises:
            InputError: a file that is not PEM, or a key that does not match the certificate.
        """
        try:
            context = ssl.create_default_context(cafile=self.ssl_ca)
            if self.ssl_insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.ssl_cert:
                context.load_cert_chain(self.ssl_cert, self.ssl_key)
        except (ssl.SSLError, OSError) as exc:
            raise InputError(f"TLS files (--ssl-ca/--ssl-cert/--ssl-key) unusable: {exc}") from None
        return context

    def http_tls_options(self) -> dict[str, Any]:
        """Keyword arguments of ``tritonclient.http.InferenceServerClient`` (and
        geventhttpclient's ``HTTPClient``) for an ``https://`` server: this access's context."""
        context = self.ssl_context()
        return {
            "ssl": True,
            "ssl_context_factory": lambda *_, **__: context,
            "insecure": self.ssl_insecure,
        }

    def http_headers(self) -> dict[str, str]:
        """The headers as one dict (a later header of the same name wins)."""
        return {h.name: h.value for h in self.headers}

    def grpc_metadata(self) -> dict[str, str]:
        """The headers as gRPC metadata: names in lower case, as gRPC requires of metadata
        keys (HTTP/2 header names are lower case; ``Authorization`` is refused as an illegal
        key, ``authorization`` is the same header)."""
        return {h.name.lower(): h.value for h in self.headers}

    def grpc_options(self) -> dict[str, Any]:
        """Keyword arguments of ``tritonclient.grpc.InferenceServerClient`` for TLS.

        Raises:
            InputError: ``--ssl-insecure`` (gRPC cannot skip the server's certificate: give the
                self-signed certificate with ``--ssl-ca``).
        """
        if not self.grpc_tls:
            return {}
        if self.ssl_insecure:
            raise InputError(
                "--ssl-insecure cannot be used over gRPC (grpc always checks the server's "
                "certificate): give the server's certificate or its CA with --ssl-ca"
            )
        return {
            "ssl": True,
            "root_certificates": self.ssl_ca,
            "private_key": self.ssl_key or (self.ssl_cert if self.ssl_cert else None),
            "certificate_chain": self.ssl_cert,
        }

    def describe(self) -> dict[str, Any]:
        """What a record may keep: which files and header names were used, no value."""
        return {
            "ssl_ca": self.ssl_ca,
            "client_certificate": self.ssl_cert is not None,
            "ssl_insecure": self.ssl_insecure,
            "headers": sorted({h.name for h in self.headers}),
        }

    def to_wire(self) -> dict[str, Any]:
        """Plain values for a generator process (sent over loopback, never written to disk)."""
        return {
            "ssl_ca": self.ssl_ca,
            "ssl_cert": self.ssl_cert,
            "ssl_key": self.ssl_key,
            "ssl_insecure": self.ssl_insecure,
            "headers": [[h.name, h.value] for h in self.headers],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> ServerAccess:
        """Inverse of :meth:`to_wire` (None: no TLS, no headers)."""
        if not data:
            return PLAIN
        return cls(
            ssl_ca=data.get("ssl_ca"),
            ssl_cert=data.get("ssl_cert"),
            ssl_key=data.get("ssl_key"),
            ssl_insecure=bool(data.get("ssl_insecure")),
            headers=tuple(Header(str(n), str(v)) for n, v in data.get("headers") or ()),
        )

    @classmethod
    def of(
        cls,
        ssl_ca: Path | str | None = None,
        ssl_cert: Path | str | None = None,
        ssl_key: Path | str | None = None,
        ssl_insecure: bool = False,
        headers: Iterable[tuple[str, str]] = (),
    ) -> ServerAccess:
        """An access from a scenario's values (paths as strings)."""
        return cls(
            ssl_ca=str(ssl_ca) if ssl_ca else None,
            ssl_cert=str(ssl_cert) if ssl_cert else None,
            ssl_key=str(ssl_key) if ssl_key else None,
            ssl_insecure=ssl_insecure,
            headers=tuple(Header(n, v) for n, v in headers),
        )


#: No TLS on gRPC, no headers (HTTP still follows its URL's scheme).
PLAIN = ServerAccess()

#: Flags whose value is (or holds) a secret.
_SECRET_FLAGS = ("--header", "-H")


def redact_command(argv: Sequence[str]) -> list[str]:
    """``argv`` with every header value replaced by :data:`REDACTED` (``--header 'Name: v'``,
    ``--header='Name: v'``); a header's name stays, to show that it was sent."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next:
            out.append(_redacted_header(arg))
            redact_next = False
            continue
        flag, eq, value = arg.partition("=")
        if flag in _SECRET_FLAGS and eq:
            out.append(f"{flag}={_redacted_header(value)}")
        else:
            out.append(arg)
            redact_next = arg in _SECRET_FLAGS
    return out


def _redacted_header(text: str) -> str:
    name, sep, _ = text.partition(":")
    return f"{name.strip()}: {REDACTED}" if sep else REDACTED


def access_denied(api: str, detail: str, access: ServerAccess = PLAIN) -> AccessDeniedError:
    """The error for a request the server refused for want of credentials.

    Args:
        api: Which API refused (Triton's group name: ``model-repository``, ``statistics``,
            ``inference``, ``health``...).
        detail: What the server said (status and message).
        access: What was sent (to say whether a header of that name was there).
    """
    expected = _EXPECTED_HEADER.search(detail)
    sent = {h.name.lower() for h in access.headers}
    if expected:
        name = expected.group(1)
        told = (
            f"the header {name!r} was sent with a value the server does not accept"
            if name.lower() in sent
            else f"it expects the header {name!r}"
        )
        fix = f"--header '{name}: ${{VAR}}' (the value from the environment) or --header-file"
    else:
        told = (
            f"headers sent: {', '.join(sorted(h.name for h in access.headers))}"
            if access.headers
            else "no header was sent"
        )
        fix = "--header 'Authorization: Bearer ${TOKEN}' or --header-file, and for TLS --ssl-*"
    return AccessDeniedError(
        f"the server refused the {api} API ({detail}): {told}; give the credentials with {fix}"
    )
