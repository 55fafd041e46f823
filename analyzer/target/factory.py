"""The target a scenario describes: :func:`make_target`, for the sweep and the gate alike.

It chooses among the implementations of :class:`~analyzer.target.protocol.Target`: a
:class:`~analyzer.target.remote.RemoteTarget` (``--url``), a
:class:`~analyzer.target.managed.ManagedServer` (the reference server) or a
:class:`~analyzer.target.triton.ManagedTriton` (``--server triton``). It lives above both modules
because ``ManagedTriton`` is a ``ManagedServer``:
:mod:`analyzer.target.triton` imports :mod:`analyzer.target.managed`, never the other way round.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.config.scenario import Scenario
from analyzer.errors import InputError
from analyzer.target.command import CommandTarget
from analyzer.target.managed import ManagedServer
from analyzer.target.protocol import Target
from analyzer.target.remote import RemoteTarget
from analyzer.target.triton import managed_triton


def make_target(scenario: Scenario, workdir: Path, url: str | None = None) -> Target:
    """The target a scenario describes: a :class:`~analyzer.target.remote.RemoteTarget` at ``url``
    (default ``scenario.model.url``), else with ``model.server = "triton"`` a
    :class:`~analyzer.target.triton.ManagedTriton` logging to
    ``workdir/server/tritonserver.log``, else a :class:`~analyzer.target.managed.ManagedServer`
    logging to ``workdir/server/server.log`` (a run directory's ``server_log``).

    Raises:
        InputError: ``--server triton`` without a binary or a repository; ``--server virtual``
            (a sweep's alone: :mod:`analyzer.predict.virtual`).
    """
    m = scenario.model
    if m.serve_command:
        if url or m.url:
            raise InputError(
                "--serve-command starts the server and --url names a running one: give one"
            )
        return CommandTarget(
            m.serve_command,
            m.name,
            m.engine or "vllm",
            Path(workdir) / "server" / "server.log",
            startup_timeout_s=m.startup_timeout_s,
        )
    address = url or m.url
    if address:
        access = m.access().check()
        return RemoteTarget(address, m.name, wait_s=scenario.run.server_wait_s, access=access)
    if m.server == "virtual":
        raise InputError(
            "--server virtual simulates a sweep in virtual time: only perfsweep run takes it; "
            "measure with the reference server (--server reference) or a real Triton"
        )
    if m.server == "triton":
        return managed_triton(
            m.name,
            m.repository,
            workdir,
            m.triton_server_path,
            m.startup_timeout_s,
            also_load=(*m.composing_models, *scenario.mix()[1:]),
        )
    return ManagedServer(
        m.name,
        m.device,
        Path(workdir) / "server" / "server.log",
        repository=m.repository,
        startup_timeout_s=m.startup_timeout_s,
        also_load=scenario.mix()[1:],
    )
