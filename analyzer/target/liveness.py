"""When the server under test is dead: the one rule, for every command.

A load step in which a request failed, or in which nothing completed, is followed by one health
check (``GET /v2/health/live`` within :data:`HEALTH_TIMEOUT_S`). A server that does not answer
it is dead, or hangs (a SIGSTOPped process, a full accept queue): the step measured no config,
and :class:`~analyzer.errors.TargetDiedError` is raised. A step without failures costs nothing;
a step whose failures the server itself answered (a queue timeout, a full queue, a missing
model) stays a measurement of the config.

Who applies it: the load generator after every step
(:meth:`analyzer.load.runner.LocustLoadGenerator.measure`: ``run``, ``gate`` and ``load``
alike) and the targets before each trial (``Target.ensure_alive``). What follows a death is the
caller's: a managed server is restarted, a ``--url`` server is waited for
(:func:`wait_for_return`, ``run.server_wait_s``), and the sweep re-runs the trial or stops
(:mod:`analyzer.sweep.loop`).

How long a dead server takes to be noticed: a refused connection fails its request at once and
the step's fail-fast rule ends the step; a hung server's requests pile up until the step's
in-flight bound or window ends it; then at most :data:`HEALTH_TIMEOUT_S` for the check.
"""

from __future__ import annotations

from collections.abc import Callable

from analyzer.errors import TargetDiedError
from analyzer.measure.measurement import Measurement
from analyzer.target.transport import Request, Transport, UrllibTransport

#: Seconds the health check waits for an answer (a loaded but live server answers in ms).
HEALTH_TIMEOUT_S = 5.0
#: Seconds between health checks while a server is waited for.
POLL_S = 1.0


def live(url: str, transport: Transport | None = None, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether the server at ``url`` (``http://host:port``) answers ``/v2/health/live`` with 200."""
    base = url if "://" in url else f"http://{url}"
    try:
        answer = (transport or UrllibTransport()).request(
            Request("GET", base.rstrip("/") + "/v2/health/live", None, timeout_s)
        )
    except OSError:
        return False
    return answer.status == 200


def suspect(m: Measurement) -> bool:
    """A step that asks for a health check: a request failed, or nothing completed."""
    return m.error_count > 0 or m.request_count == 0


def check_step(m: Measurement, url: str, transport: Transport | None = None) -> None:
    """Apply the rule to one measured step.

    Raises:
        TargetDiedError: The step had failures (or nothing completed) and the server does not
            answer its health check.
    """
    if not suspect(m) or live(url, transport):
        return
    kinds = sorted(m.errors.items(), key=lambda kv: -kv[1])
    why = f"{m.error_count} of {m.request_count} requests failed" + (
        f" ({kinds[0][0]})" if kinds else ""
    )
    if m.request_count == 0:
        why = "no request completed"
    raise TargetDiedError(
        f"the server at {url} died or hangs: it stopped answering during a load step at "
        f"{m.target:g} ({why}) and fails its health check",
        url,
    )


def wait_for_return(
    url: str,
    wait_s: float,
    on_wait: Callable[[str], None] = lambda text: None,
    *,
    transport: Transport | None = None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> float | None:
    """Poll ``url``'s health until it answers or ``wait_s`` pass.

    Returns:
        The seconds waited when the server came back, None when it did not.
    """
    started = clock()
    on_wait(f"the server at {url} is not answering: waiting up to {wait_s:g} s for it to return")
    while True:
        if live(url, transport):
            waited = clock() - started
            on_wait(f"the server at {url} answers again after {waited:.1f} s")
            return waited
        if clock() - started >= wait_s:
            return None
        sleep(POLL_S)
