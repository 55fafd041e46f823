"""The ``io`` guard (``tests/support/io_guard.py``) and the marks that fixtures set.

The first tests are unmarked, so the guard is on while they run: each guarded call must raise
:class:`~tests.support.io_guard.UnmarkedIoError` naming the fixture to request. Were the guard off, the process calls
would start real (harmless) children and the socket calls would bind or be refused, and every
``expect_violation`` block would fail. The ``pytester`` runs check what a real conftest does with
it: the marks follow the fixtures, a swallowed error still fails the test, a session fixture's
I/O is charged to the unmarked test that pulls it in, and a hand-set ``io`` mark is refused.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.io_guard import IO_MARKER, IoGuard


@pytest.fixture
def guard(request: pytest.FixtureRequest) -> IoGuard:
    """The session's guard; fails unless this test runs unmarked (so the guard is on)."""
    assert request.node.get_closest_marker(IO_MARKER) is None
    plugin = request.config.pluginmanager.get_plugin("perfsweep_io_guard")
    assert isinstance(plugin, IoGuard)
    return plugin


def _fork_and_reap() -> None:
    pid = os.fork()
    if pid == 0:  # only if the guard let the fork through: the child leaves at once
        os._exit(0)
    os.waitpid(pid, 0)


def _spawn_process() -> None:
    process = multiprocessing.get_context("spawn").Process(target=int)
    process.start()
    process.join()


def _pool_map() -> None:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.map(int, [1])


PROCESS_CALLS: dict[str, Callable[[], object]] = {
    "Popen": lambda: subprocess.Popen([sys.executable, "-c", "pass"]).wait(),
    "run": lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    "check_output": lambda: subprocess.check_output(["true"]),
    "os.system": lambda: os.system("true"),
    "os.fork": _fork_and_reap,
    "os.posix_spawn": lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0),
    "multiprocessing.Process": _spawn_process,
    "multiprocessing.Pool": _pool_map,
}


@pytest.mark.parametrize("call", PROCESS_CALLS.values(), ids=PROCESS_CALLS.keys())
def test_an_unmarked_test_cannot_start_a_process(
    guard: IoGuard, call: Callable[[], object]
) -> None:
    with guard.expect_violation("spawns"):
        call()


def _tcp_bind() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))


def _tcp_connect() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.connect(("127.0.0.1", 9))  # refused, were the guard off


def _tcp_connect_ex() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert sock.connect_ex(("127.0.0.1", 9)) == 0, "refused: the guard let it through"


def _create_connection() -> None:
    socket.create_connection(("127.0.0.1", 9), timeout=1).close()


def _udp_bind() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))


def _unix_bind(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(tmp_path / "s"))


def _urlopen() -> None:
    import urllib.request

    urllib.request.urlopen("http://127.0.0.1:9/", timeout=1)


SOCKET_CALLS: dict[str, Callable[[Path], object]] = {
    "bind": lambda _: _tcp_bind(),
    "connect": lambda _: _tcp_connect(),
    "connect_ex": lambda _: _tcp_connect_ex(),
    "create_connection": lambda _: _create_connection(),
    "udp bind": lambda _: _udp_bind(),
    "AF_UNIX bind": _unix_bind,
    "urlopen": lambda _: _urlopen(),
}


@pytest.mark.parametrize("call", SOCKET_CALLS.values(), ids=SOCKET_CALLS.keys())
def test_an_unmarked_test_cannot_bind_or_connect(
    guard: IoGuard, call: Callable[[Path], object], tmp_path: Path
) -> None:
    with guard.expect_violation("serves"):
        call(tmp_path)


def test_a_thread_the_test_starts_is_guarded_too(guard: IoGuard) -> None:
    caught: list[BaseException] = []

    def bind() -> None:
        try:
            with guard.expect_violation("serves"):
                _tcp_bind()
        except BaseException as exc:  # pytest.raises' failure, shown by the assert below
            caught.append(exc)

    thread = threading.Thread(target=bind)
    thread.start()
    thread.join()
    assert caught == []


def test_the_error_names_the_test_the_call_the_caller_and_the_way_out(
    guard: IoGuard, request: pytest.FixtureRequest
) -> None:
    with guard.expect_violation("serves") as info:
        _tcp_bind()
    message = str(info.value)
    assert message.startswith(f"{request.node.nodeid} called socket.socket.bind (from ")
    assert "tests/unit/test_io_guard.py" in message and "_tcp_bind" in message
    assert "not marked 'io'" in message
    assert 'pytest.mark.usefixtures("serves")' in message and "make test-fast" in message


def test_a_socket_pair_needs_no_mark(guard: IoGuard) -> None:
    # asyncio's event loop makes one for itself; it neither binds nor connects.
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"


@pytest.mark.usefixtures("serves", "spawns")
def test_an_io_test_binds_connects_and_spawns(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker(IO_MARKER) is not None
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname()[:2], timeout=5).close()
    done = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True)
    assert done.stdout == "ok\n"


# -- a real conftest, run by pytester -------------------------------------------------------

#: The conftest of the inner runs: this project's own hooks and fixtures, nothing else.
INNER_CONFTEST = """
from tests.conftest import (
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_unconfigure,
    quiet_machine,
    serves,
    spawns,
    takes_seconds,
)
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, guard: IoGuard) -> Iterator[pytest.Pytester]:
    """A pytester with this project's conftest and markers; unmarked, as its runs are inline:
    the outer guard must not see any inner test's I/O (the inner guard stops it first)."""
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\naddopts = "--strict-markers -p no:cacheprovider"\n'
        'markers = ["io: ...", "slow: ...", "quiet: ..."]\n'
    )
    yield pytester
    assert guard.violations == []


def test_the_marks_follow_the_fixtures(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import pytest

        @pytest.fixture
        def server(serves):
            return "a server"

        def test_pure(): pass
        def test_direct(spawns): pass
        def test_through_a_fixture(server): pass
        @pytest.mark.usefixtures("serves")
        def test_used(): pass
        @pytest.mark.usefixtures("takes_seconds")
        def test_slow(): pass
        """
    )
    io = inner.runpytest("-m", "io", "--collect-only", "-q")
    assert sorted(line.split("::")[1] for line in io.outlines if "::" in line) == [
        "test_direct",
        "test_through_a_fixture",
        "test_used",
    ]
    fast = inner.runpytest("-m", "not io and not slow", "--collect-only", "-q")
    assert [line.split("::")[1] for line in fast.outlines if "::" in line] == ["test_pure"]


def test_an_io_mark_set_by_hand_is_refused(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import pytest

        @pytest.mark.io
        def test_by_hand(): pass
        """
    )
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*marked 'io', 'quiet' or 'live' by hand, not through a fixture*test_by_hand*"]
    )


def test_a_swallowed_error_still_fails_the_test(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import socket

        def test_swallows():
            try:
                socket.create_connection(("127.0.0.1", 9), timeout=1)
            except Exception:
                pass  # what code under test might do with any error
        """
    )
    result = inner.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_swallows called socket.socket.connect*'serves'*"])


def test_a_session_fixture_s_io_fails_the_unmarked_test_that_pulls_it_in(
    inner: pytest.Pytester,
) -> None:
    inner.makepyfile(
        """
        import socket
        import pytest

        @pytest.fixture(scope="session")
        def port():
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                return sock.getsockname()[1]

        def test_pulls_it_in(port): pass
        """
    )
    result = inner.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_pulls_it_in called socket.socket.bind*'serves'*"])
