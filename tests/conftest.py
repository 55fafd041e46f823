"""Shared pytest fixtures. Keep this file small: put helpers in ``tests/support/``."""

from __future__ import annotations

import os
import platform
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import analyzer  # noqa: F401  (first: turns gRPC's fork handlers off before grpc is imported)
from tests.support.folder_times import FolderTimes
from tests.support.io_guard import IO_FIXTURES, IO_MARKER, IoGuard
from tests.support.live_sweeps import LIVE_FIXTURE, LIVE_MARKER, LiveSweeps
from tests.support.llm_model import VllmInstall, VllmServer, VllmUnavailable, ensure_model
from tests.support.quiet import QUIET_FIXTURE, QUIET_MARKER, QuietMachine
from tests.support.real_triton import (
    RealTriton,
    TritonInstall,
    TritonUnavailable,
    identity_model_config,
)


def pytest_configure(config: pytest.Config) -> None:
    # ``platform`` runs ``uname -p`` the first time a process asks for the processor, as every
    # sweep's ``analyzer.rundir.results.environment`` does; asked once here, before the guard is on,
    # the answer is cached and a sweep against the planted fakes stays free of processes.
    platform.uname().processor  # noqa: B018
    # A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and children
    # inherit an ignored signal: the tests that press Ctrl-C on a child would then see it
    # ignored. Handled (not ignored) here, every child starts with Python's own Ctrl-C.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # A report is rendered only where a report is under test (about 7 s a sweep, most of it
    # matplotlib): every sweep the suite runs, in this process or a child, reads this default
    # through the scenario's environment overrides; a test of the report asks for one with
    # ``--report`` or ``run.report = true``.
    os.environ.setdefault("PERFSWEEP_RUN_REPORT", "false")
    _build_font_cache()
    guard = IoGuard()
    guard.install()
    config.pluginmanager.register(guard, "perfsweep_io_guard")
    config.pluginmanager.register(FolderTimes(), "perfsweep_folder_times")
    live = LiveSweeps()
    live.install()
    config.pluginmanager.register(live, "perfsweep_live_sweeps")
    config.pluginmanager.register(QuietMachine(config), "perfsweep_quiet_machine")


def _build_font_cache() -> None:
    """matplotlib lists the machine's fonts (an ``fc-list`` child process) the first time it is
    imported on a machine, and caches the list. On a fresh machine the first test that renders a
    figure would start that process under the guard: the list is made here, before the guard is
    on, and only when no cache is there (importing the font manager costs about a second)."""
    import matplotlib

    if not any(Path(matplotlib.get_cachedir()).glob("fontlist-*.json")):
        import matplotlib.font_manager


def pytest_unconfigure(config: pytest.Config) -> None:
    # In the reverse order of installing: each puts back what it found.
    live = config.pluginmanager.get_plugin("perfsweep_live_sweeps")
    if isinstance(live, LiveSweeps):
        live.uninstall()
    guard = config.pluginmanager.get_plugin("perfsweep_io_guard")
    if isinstance(guard, IoGuard):
        guard.uninstall()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``io`` every test whose fixtures include ``spawns`` or ``serves`` (and only those),
    ``slow`` every test that requests ``takes_seconds`` and ``quiet`` every test that requests
    ``quiet_machine``.

    The ``io`` mark follows from what a test requests, so it cannot drift from what the test
    does: ``tests/support/io_guard.py`` fails an unmarked test that starts a process or opens a
    socket. ``make test-fast`` runs ``-m "not io and not slow"``.
    """
    by_hand = []
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "takes_seconds" in fixtures:
            item.add_marker("slow")
        if QUIET_FIXTURE in fixtures:
            item.add_marker(QUIET_MARKER)
        if LIVE_FIXTURE in fixtures:
            item.add_marker(LIVE_MARKER)
        uses_io = not IO_FIXTURES.isdisjoint(fixtures)
        if uses_io:
            item.add_marker(IO_MARKER)
        elif item.get_closest_marker(IO_MARKER) is not None:
            by_hand.append(item.nodeid)
        if QUIET_FIXTURE not in fixtures and item.get_closest_marker(QUIET_MARKER) is not None:
            by_hand.append(item.nodeid)
        if LIVE_FIXTURE not in fixtures and item.get_closest_marker(LIVE_MARKER) is not None:
            by_hand.append(item.nodeid)
    if by_hand:
        raise pytest.UsageError(
            f"marked {IO_MARKER!r}, {QUIET_MARKER!r} or {LIVE_MARKER!r} by hand, not through a "
            f"fixture: {', '.join(by_hand)}; request 'spawns', 'serves', {QUIET_FIXTURE!r} or "
            f"{LIVE_FIXTURE!r} instead"
        )


@pytest.fixture(scope="session")
def spawns() -> None:
    """Request this (or a fixture that does) to start child processes; marks the test ``io``.

    It does nothing itself: the guard in ``tests/support/io_guard.py`` lets ``io`` tests start
    processes and open sockets, and fails every other test that does.
    """


@pytest.fixture(scope="session")
def serves() -> None:
    """Request this (or a fixture that does) to start a server or open a socket; marks ``io``.

    Like :func:`spawns`, it does nothing itself; the two names say what a test does.
    """


@pytest.fixture(scope="session")
def takes_seconds() -> None:
    """Request this in a test that takes a second or more by design; marks it ``slow``, so
    ``make test-fast`` leaves it to ``make test``.

    Whole sweeps against the planted fakes, simulator capacity searches, statistical checks
    over many draws and core tests that wait out real batching delays are such tests. They need
    no process or socket, so the guard never asks for this: it keeps the fast tier under a
    minute, nothing more.
    """


@pytest.fixture(scope="session")
def live_sweep(spawns: None) -> None:
    """Request this in a test that runs ``perfsweep run`` against a live server (a real reference
    server or Triton): marks it ``live`` (and ``io``), the tier ``make test`` runs last and
    alone. Few tests may: a sweep's behaviour is tested in virtual time
    (``tests/sweep/test_virtual_sweeps.py``); a live sweep is for what only a real server and
    real processes show."""


@pytest.fixture(scope="session")
def quiet_machine() -> None:
    """Request this in a test that holds a measured latency or rate to a tight bound: it runs
    alone while ``make test`` runs the other tests on every core (``tests/support/quiet.py``)."""


@pytest.fixture(scope="session")
def triton_install(spawns: None) -> TritonInstall:
    """The real ``tritonserver`` from the nvidia-pytriton wheel; skips (with why) when absent."""
    try:
        return TritonInstall.locate()
    except TritonUnavailable as exc:
        pytest.skip(f"real Triton unavailable: {exc}")


@pytest.fixture(scope="session")
def real_triton(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealTriton]:
    """One real Triton for the session, on loopback with free ports, explicit model control.

    The FP32 ``identity`` model (``INPUT0``/``OUTPUT0``, dims [16], max_batch_size 8, dynamic
    batching with 100 µs delay) is loaded. Tests may add models with ``add_model`` +
    ``load_model``; use distinct model names, since the server is shared. A test that needs
    ``TRITONSERVER_DELAY_SCHEDULER`` or fresh statistics starts its own ``RealTriton``.
    """
    triton = RealTriton(
        triton_install,
        tmp_path_factory.mktemp("real_triton"),
        models=[identity_model_config()],
    )
    triton.start()
    try:
        yield triton
    finally:
        triton.stop()


@pytest.fixture(scope="session")
def vllm_install(spawns: None) -> VllmInstall:
    """vLLM's CPU build in ``.venv-vllm`` (``make setup-llm``); skips (with why) when absent."""
    try:
        return VllmInstall.locate()
    except VllmUnavailable as exc:
        pytest.skip(f"vLLM unavailable: {exc}")


@pytest.fixture(scope="session")
def vllm_server(
    vllm_install: VllmInstall, live_sweep: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """One vLLM CPU server for the session (``tests/support/llm_model.py``): the random-weight
    test model as ``rand-llama``, ``--max-num-seqs 8``, on loopback. Marks its tests ``live``:
    it starts in about a minute and holds about 3.5 GB, so they run in the last tier, alone.
    ``--enforce-eager``: no torch.compile warm-up, which would add half a minute to the start
    and change nothing the tests look at."""
    model = ensure_model(vllm_install)  # a failure here is an error, not a reason to skip
    with VllmServer(
        vllm_install, model, tmp_path_factory.mktemp("vllm"), extra_args=("--enforce-eager",)
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def _process_stays_unpatched(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that monkey-patched the pytest process with gevent (by importing Locust).

    A patched process turns later tests' threads into greenlets and hangs them; tests that need
    the real load engine run it in a child process (``perfsweep`` CLI or ``python -c``).
    """
    yield
    import sys

    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        pytest.fail(
            f"{request.node.nodeid} monkey-patched the test process with gevent; "
            "run the load engine in a subprocess instead",
            pytrace=False,
        )
