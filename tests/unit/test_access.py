"""How a secured server is reached (``analyzer.config.access``): headers from flags, the
environment and files; what records keep of them (names, never values); the TLS files checked
before anything starts; the refusal message naming the API and the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.config.access import (
    PLAIN,
    REDACTED,
    Header,
    ServerAccess,
    access_denied,
    collect_headers,
    parse_header,
    read_header_file,
    redact_command,
)
from analyzer.config.scenario import access_overrides, load_scenario
from analyzer.errors import AccessDeniedError, InputError
from analyzer.target.transport import KeepAliveTransport, Request, UrllibTransport

SECRET = "s3cret-value-4711"


def test_a_header_value_may_come_from_the_environment() -> None:
    header = parse_header("Authorization: Bearer ${TOKEN}", {"TOKEN": SECRET})
    assert header == Header("Authorization", f"Bearer {SECRET}")
    assert SECRET not in repr(header)  # a value never shows in a repr (logs, tracebacks)
    with pytest.raises(InputError, match="environment variable TOKEN is not set"):
        parse_header("Authorization: Bearer ${TOKEN}", {})


@pytest.mark.parametrize("text", ["no colon here", "bad name: x", ": empty name"])
def test_a_malformed_header_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="expected 'Name: value'"):
        parse_header(text, {})


def test_a_header_file_skips_comments_and_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "headers"
    path.write_text(f"# tokens\n\nadmin-key: {SECRET}\nX-Env: ${{V}}\n")
    assert read_header_file(path, {"V": "v"}) == [
        Header("admin-key", SECRET),
        Header("X-Env", "v"),
    ]
    path.write_text("ok: 1\nbroken\n")
    with pytest.raises(InputError, match=r"headers:2"):
        read_header_file(path, {})
    with pytest.raises(InputError, match="--header-file"):
        read_header_file(tmp_path / "missing", {})


def test_flags_follow_the_file_and_none_given_is_none(tmp_path: Path) -> None:
    path = tmp_path / "h"
    path.write_text("A: from-file\n")
    assert collect_headers(["B: flag"], [path], {}) == (("A", "from-file"), ("B", "flag"))
    assert collect_headers(None, None, {}) is None


def test_a_recorded_command_keeps_header_names_not_values() -> None:
    argv = [
        "perfsweep",
        "run",
        "--header",
        f"Authorization: Bearer {SECRET}",
        f"--header=admin-key: {SECRET}",
        "-H",
        SECRET,
        "--url",
        "https://h:1",
    ]
    redacted = redact_command(argv)
    assert SECRET not in " ".join(redacted)
    assert redacted[3] == f"Authorization: {REDACTED}"
    assert redacted[4] == f"--header=admin-key: {REDACTED}"
    assert redacted[6] == REDACTED
    assert redacted[-2:] == ["--url", "https://h:1"]


def test_the_scenario_holds_headers_but_never_writes_or_hashes_them() -> None:
    plain = load_scenario(None, {"model.url": "http://127.0.0.1:1"}, env={})
    secured = load_scenario(
        None,
        {"model.url": "http://127.0.0.1:1", **access_overrides(headers=[f"X-Key: {SECRET}"])},
        env={},
    )
    assert secured.model.access().http_headers() == {"X-Key": SECRET}
    for text in (secured.to_toml(), str(secured.to_dict()), repr(secured)):
        assert SECRET not in text
    assert secured.hash() == plain.hash()
    # scenario.toml read back: no header (a resumed run is given it again).
    assert load_scenario(None, {"model.url": "http://127.0.0.1:1"}, env={}).model.headers == ()


def test_describe_says_what_was_used_never_its_value() -> None:
    access = ServerAccess(
        ssl_ca="ca.pem", ssl_cert="c.pem", headers=(Header("Authorization", SECRET),)
    )
    described = access.describe()
    assert described == {
        "ssl_ca": "ca.pem",
        "client_certificate": True,
        "ssl_insecure": False,
        "headers": ["Authorization"],
    }
    assert ServerAccess.from_wire(access.to_wire()) == access
    assert ServerAccess.from_wire(None) is PLAIN and not PLAIN


def test_tls_files_are_checked_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--ssl-ca nope\.pem: no such file"):
        ServerAccess(ssl_ca="nope.pem").check()
    key = tmp_path / "k.pem"
    key.write_text("not a key")
    with pytest.raises(InputError, match="--ssl-key needs --ssl-cert"):
        ServerAccess(ssl_key=str(key)).check()
    with pytest.raises(InputError, match="unusable"):
        ServerAccess(ssl_ca=str(key)).check()  # not PEM
    with pytest.raises(InputError, match="skips the check"):
        ServerAccess(ssl_ca=str(key), ssl_insecure=True).check()


def test_grpc_cannot_skip_the_certificate_check() -> None:
    with pytest.raises(InputError, match="give the server's certificate or its CA with --ssl-ca"):
        ServerAccess(ssl_insecure=True).grpc_options()
    assert ServerAccess(ssl_ca="ca.pem").grpc_options() == {
        "ssl": True,
        "root_certificates": "ca.pem",
        "private_key": None,
        "certificate_chain": None,
    }
    assert PLAIN.grpc_options() == {}


def test_a_refusal_names_the_api_the_expected_header_and_the_flag() -> None:
    error = access_denied(
        "model-repository", "HTTP 403: This API is restricted, expecting header 'admin-key'"
    )
    assert isinstance(error, AccessDeniedError) and error.exit_code == 2
    assert "refused the model-repository API" in str(error)
    assert "expects the header 'admin-key'" in str(error) and "--header" in str(error)
    sent = ServerAccess(headers=(Header("admin-key", SECRET),))
    wrong = access_denied("statistics", "expecting header 'admin-key'", sent)
    assert "sent with a value the server does not accept" in str(wrong)
    assert SECRET not in str(wrong)
    proxy = access_denied("health", "HTTP 401: missing or wrong token", sent)
    assert "headers sent: admin-key" in str(proxy) and SECRET not in str(proxy)


def test_every_transport_request_carries_the_headers() -> None:
    access = ServerAccess(headers=(Header("Authorization", "Bearer t"),))
    # The real transports merge the access's headers into each request; its own win a clash.
    request = Request("POST", "http://h:1/x", {"a": 1}, headers={"X-Own": "1"})
    for transport in (KeepAliveTransport(access=access), UrllibTransport(access)):
        assert transport.headers(request)[1] == {
            "Authorization": "Bearer t",
            "X-Own": "1",
            "Content-Type": "application/json",
        }
    assert UrllibTransport().headers(request)[1] == {
        "X-Own": "1",
        "Content-Type": "application/json",
    }


def test_grpc_metadata_keys_are_lower_case() -> None:
    # gRPC refuses "Authorization" as a metadata key ("Illegal header key"); HTTP/2 header
    # names are lower case, so "authorization" is the same header.
    from analyzer.config.access import Header, ServerAccess

    access = ServerAccess(headers=(Header("Authorization", "Bearer t"), Header("admin-key", "k")))
    assert access.grpc_metadata() == {"authorization": "Bearer t", "admin-key": "k"}
    assert access.http_headers() == {"Authorization": "Bearer t", "admin-key": "k"}
