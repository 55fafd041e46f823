"""The raw HTTP hot path (the engine's default) sends correct requests and reads answers right.

Each check runs in a child process (``tests/load/client_driver.py``): the client is gevent code.
The engine-level contracts that also go through this client by default (latency from the
intended send under a device stall, failures filed by status and message, a full pool's backlog)
are in ``test_coordinated_omission.py``; HDR recording and counts in ``test_accuracy.py``.
"""

from __future__ import annotations

import pytest

from tests.load.client_driver import run_client_checks

pytestmark = pytest.mark.usefixtures("spawns")


def test_responses_decode_to_the_inputs_of_an_identity_model() -> None:
    answer = run_client_checks("outputs")
    rows = answer["payloads"]
    assert len(rows) == 2 * answer["payload_count"] == 8
    assert all(r["status"] == 200 and r["equal"] for r in rows), rows
    assert all(r["shapes"] == [[3, 16], [3, 4]] for r in rows)
    assert answer["idle_connections"] == 1  # sequential requests reuse one connection


def test_error_kinds_match_geventhttpclient_and_tritonclient() -> None:
    answer = run_client_checks("errors")
    for case, status in (("unknown_model", 404), ("wrong_shape", 400)):
        kinds = answer[case]
        assert kinds["raw"] == kinds["pooled"] == f"HTTP {status}: {kinds['tritonclient']}", kinds
    assert "no_such_model" in answer["unknown_model"]["raw"]
    assert answer["refused"] == "ConnectionRefusedError"


def test_stale_keepalive_is_retried_but_a_half_answer_is_not() -> None:
    answer = run_client_checks("stub")
    # the server closed each idle connection: every request found out, reconnected, succeeded
    assert answer["stale"] == {"connections": 3, "requests": 3}
    chunked = answer["chunked"]
    assert chunked["status"] == 200 and chunked["body"] == '{"model_name":"m","outputs":[]}'
    assert chunked["after"]["requests"] == 2 and chunked["after"]["connections"] == 1
    # response bytes arrived, then the connection died: an error, and the request is not re-sent
    assert answer["half"]["error"] == "the server closed the connection inside the response body"
    assert answer["half"]["requests"] == 1


def test_the_dispatcher_timer_never_wakes_before_its_deadline() -> None:
    answer = run_client_checks("sleeper")
    assert answer["timerfd"]["precise"] is True  # Linux: the timerfd path is the one in use
    assert answer["gevent"]["precise"] is False
    for path in ("timerfd", "gevent"):
        assert answer[path]["waits"] == 200 and answer[path]["early"] == 0, answer
        assert answer[path]["closed"]
