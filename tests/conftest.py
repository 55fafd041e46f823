"""Shared pytest fixtures. Keep this file small: put helpers in ``tests/support/``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.real_triton import (
    RealTriton,
    TritonInstall,
    TritonUnavailable,
    identity_model_config,
)


@pytest.fixture(scope="session")
def triton_install() -> TritonInstall:
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
