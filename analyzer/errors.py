"""Errors of perfsweep. The CLI alone turns them into exit codes.

::

    PerfsweepError          root (exit 1 unless a subclass says otherwise)
    ├── InputError          bad flags, scenario, config or result file (exit 2)
    │   ├── ScenarioError   a scenario that cannot be run (unknown key, impossible bounds)
    │   ├── ResultFormatError  a result file of an unknown format version
    │   └── AccessDeniedError  the server refused perfsweep's credentials (a restricted API,
    │                          a proxy's token check, a TLS handshake)
    ├── TargetError         the server under test failed or cannot be reached (exit 3)
    │   └── TargetDiedError the server died or hung mid-run (:mod:`analyzer.target.liveness`)
    └── GoalNotMetError     the measurement ran but the goal or gate failed (exit 1)

Messages say what happened and what to do next.
"""

from __future__ import annotations


class PerfsweepError(Exception):
    """Root of every error perfsweep raises on purpose."""

    exit_code = 1


class InputError(PerfsweepError):
    """The user's input (flags, scenario, config, result file) is invalid."""

    exit_code = 2


class ScenarioError(InputError):
    """A scenario that cannot be run as written."""


class ResultFormatError(InputError):
    """A result file this version of perfsweep cannot read."""


class AccessDeniedError(InputError):
    """The server (or a proxy in front of it) refused a request for want of the right header,
    token or certificate: the user's flags must change, so exit 2 as any bad input."""


class TargetError(PerfsweepError):
    """The server under test failed, died, or cannot be reached."""

    exit_code = 3


class TargetDiedError(TargetError):
    """The server under test died, or hangs, in the middle of a run: a server failure, never a
    measurement (:mod:`analyzer.target.liveness` holds the rule). Exit 3, as any target failure.

    Attributes:
        url: The server's HTTP address.
        outcome: What the run had when it stopped (a sweep's ``SweepOutcome``), or None.
    """

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.outcome: object | None = None


class GoalNotMetError(PerfsweepError):
    """The measurement completed but the goal or gate was not met."""

    exit_code = 1
