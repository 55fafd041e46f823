"""The TLS and restricted-API flags as data: parsing, the group of each API, the refusal texts.

No server here (``test_security_serving.py`` serves them). The texts are Triton 2.51's, read on
the real binary: ``tests/differential/test_security_vs_triton.py`` holds the same requests
against both servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2 as pb

from reference_server.__main__ import build_parser, main
from reference_server.app import ServerOptions
from reference_server.core.errors import ServerError
from reference_server.frontends.restricted import (
    GROUPS,
    GRPC_METHOD_GROUPS,
    Restriction,
    grpc_allows,
    grpc_refusal,
    http_allows,
    http_group,
    http_refusal,
    parse_restrictions,
)
from reference_server.ready import ServerAddresses, parse_ready_line

# ------------------------------------------------------------------------------ parsing


def test_a_value_restricts_each_listed_group_with_one_header() -> None:
    restrictions = parse_restrictions(
        ["model-config,statistics:admin-key=secret", "inference:infer-key=a=b"],
        option="http-restricted-api",
    )
    assert dict(restrictions.by_group) == {
        "model-config": Restriction("admin-key", "secret"),
        "statistics": Restriction("admin-key", "secret"),
        # Split at the first ":" and the first "=" after it, as tritonserver does.
        "inference": Restriction("infer-key", "a=b"),
    }
    assert restrictions.get("health") is None and restrictions.get(None) is None
    assert not parse_restrictions([], option="http-restricted-api")


def test_grpc_keys_get_tritons_metadata_prefix() -> None:
    restrictions = parse_restrictions(
        ["health:k=v"], option="grpc-restricted-protocol", header_prefix="triton-grpc-protocol-"
    )
    assert restrictions.get("health") == Restriction("triton-grpc-protocol-k", "v")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["health"],
            "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health",
        ),
        (["health:=v"], "option format is '<config name>:<setting>=<value>'. Got health:=v"),
        (["health:k="], "option format is '<config name>:<setting>=<value>'. Got health:k="),
        ([":k=v"], "option format is '<config name>:<setting>=<value>'. Got :k=v"),
        (["foo:k=v"], "unknown restricted api 'foo'"),
        (["Health:k=v"], "unknown restricted api 'Health'"),  # names are case-sensitive
        (["health,:k=v"], "unknown restricted api ''"),
        (
            ["health:k=v", "trace,health:k2=v2"],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
        (
            ["health,health:k=v"],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
    ],
)
def test_malformed_values_are_refused_with_tritons_message(values: list[str], message: str) -> None:
    with pytest.raises(ServerError) as caught:
        parse_restrictions(values, option="http-restricted-api")
    assert message in caught.value.message


def test_grpc_messages_say_protocol() -> None:
    with pytest.raises(ServerError, match="unknown restricted protocol 'bad'"):
        parse_restrictions(["bad:k=v"], option="grpc-restricted-protocol")


def test_bad_flag_values_exit_2_with_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model-repository=/nonexistent", "--grpc-restricted-protocol=health:k"]) == 2
    assert capsys.readouterr().err == (
        "error: --grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. "
        "Got health:k\n"
    )
    assert main(["--grpc-use-ssl=true"]) == 2
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--grpc-use-ssl=maybe"])
    assert "invalid value for bool option: maybe" in capsys.readouterr().err


# ------------------------------------------------------------------------------ TLS flags


@pytest.mark.parametrize(
    ("flags", "ssl_and_mutual"),
    [
        ([], (False, False)),
        (["--grpc-use-ssl=true"], (True, False)),
        (["--grpc-use-ssl", "ON"], (True, False)),
        (["--grpc-use-ssl-mutual=1"], (True, True)),
        # The mutual flag turns TLS on whatever its value (checked on tritonserver 2.51).
        (["--grpc-use-ssl-mutual=false"], (True, False)),
        (["--grpc-use-ssl=false", "--grpc-use-ssl-mutual=true"], (True, True)),
        # ... and a later --grpc-use-ssl=false turns it off again: plain text.
        (["--grpc-use-ssl-mutual=true", "--grpc-use-ssl=false"], (False, True)),
    ],
)
def test_ssl_flags_are_read_in_order_as_tritonserver(
    flags: list[str], ssl_and_mutual: tuple[bool, bool]
) -> None:
    assert build_parser().parse_args(flags).grpc_ssl == ssl_and_mutual


def test_tls_options_need_their_files() -> None:
    with pytest.raises(ServerError, match="--grpc-use-ssl-mutual needs --grpc-server-cert"):
        ServerOptions(grpc_use_ssl_mutual=True)
    options = ServerOptions(
        grpc_use_ssl=True, grpc_server_cert=Path("s.pem"), grpc_server_key=Path("s.key")
    )
    assert options.grpc_tls
    assert not ServerOptions(grpc_server_cert=Path("ignored.pem")).grpc_tls


def test_the_ready_line_says_grpc_is_tls_and_nothing_else() -> None:
    plain = ServerAddresses("127.0.0.1", 1, 2, 3)
    mutual = ServerAddresses("127.0.0.1", 1, 2, 3, grpc_tls="mutual")
    assert "tls" not in plain.ready_line()
    assert mutual.ready_line().endswith(" metrics=127.0.0.1:3 grpc-tls=mutual")
    assert parse_ready_line(mutual.ready_line()) == mutual
    assert parse_ready_line(plain.ready_line()) == plain
    assert parse_ready_line(mutual.ready_line()[:-2]) is None  # still being written


# ------------------------------------------------------------------------------ the groups


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/v2", "metadata"),
        ("/v2/health/live", "health"),
        ("/v2/health/ready", "health"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/2", "metadata"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/1/infer", "inference"),
        ("/v2/models/m/generate", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/stats", "statistics"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/repository/models/m/unload", "model-repository"),
        ("/v2/repository/r/models/m/load", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
        ("/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
        # Not APIs: never refused, answered 404 as before.
        ("/v2/models/m/versions/1/trace/setting", None),
        ("/v2/models/m/nothing", None),
        ("/v2/health", None),
        ("/metrics", None),
        ("/", None),
    ],
)
def test_http_paths_belong_to_tritons_groups(path: str, group: str | None) -> None:
    assert http_group(path) == group


def test_every_grpc_method_has_a_group() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods = {f"/{service.full_name}/{method.name}" for method in service.methods}
    assert methods == set(GRPC_METHOD_GROUPS) - {"/grpc.health.v1.Health/Check"}
    assert set(GRPC_METHOD_GROUPS.values()) == set(GROUPS)


# ------------------------------------------------------------------------------ the check


def test_http_headers_match_by_name_in_any_case_and_value_exactly() -> None:
    from multidict import CIMultiDict

    restriction = Restriction("admin-key", "secret")
    assert http_allows(restriction, CIMultiDict({"Admin-Key": "secret"}))
    assert not http_allows(restriction, CIMultiDict({"admin-key": "Secret"}))
    assert not http_allows(restriction, CIMultiDict())
    # Of repeated headers the first counts, as in Triton (libevhtp's lookup).
    assert not http_allows(restriction, CIMultiDict([("admin-key", "x"), ("admin-key", "secret")]))
    assert http_refusal(restriction) == "This API is restricted, expecting header 'admin-key'"


def test_grpc_metadata_matches_the_prefixed_key() -> None:
    restriction = Restriction("triton-grpc-protocol-k", "v")
    assert grpc_allows(restriction, [("triton-grpc-protocol-k", "v")])
    assert not grpc_allows(restriction, [("k", "v")])
    assert not grpc_allows(restriction, [("triton-grpc-protocol-k", "w")])
    assert grpc_refusal(restriction) == (
        "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
    )
