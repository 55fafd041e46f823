"""Sleep until a ``time.perf_counter()`` deadline with sub-millisecond precision, under gevent.

The open-loop dispatcher times every request from its intended send time, so however late the
dispatcher wakes is added to every latency it reports. ``gevent.sleep`` rides on libev's epoll
timeout, which has millisecond granularity and is rounded up: on the 2-core test machine a
Poisson schedule at 400 req/s woke 0.6 ms late at the median and 2.2 ms late at p99 with nothing
else to do, against 0.05 ms and 0.6 ms for a Linux ``timerfd`` (an hrtimer) watched by the same
hub (``benchmarks/README.md``, generator vs perf_analyzer). ``DeadlineSleeper`` arms a timerfd at
the absolute deadline and waits for it to become readable, so the hub keeps serving other
greenlets meanwhile. Where timerfd is unavailable (not Linux, or ``perf_counter`` is not
``CLOCK_MONOTONIC``) it falls back to ``gevent.sleep``.

One sleeper per greenlet: a gevent io watcher can be waited on by one greenlet at a time.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import ctypes
import ctypes.util
import os
import sys
import time
from typing import Any

import gevent
from gevent.hub import get_hub

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any | None:
    """libc with timerfd, when ``perf_counter`` reads the clock a timerfd can be armed on."""
    if not sys.platform.startswith("linux"):
        return None
    if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.timerfd_create  # noqa: B018 - probe: AttributeError when libc lacks it
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class DeadlineSleeper:
    """``sleep_until(deadline)`` on a timerfd (precise) or ``gevent.sleep`` (fallback).

    Never returns before ``deadline`` on either path. Call ``close`` when done.
    """

    def __init__(self, use_timerfd: bool = True) -> None:
        self._fd = -1
        self._watcher: Any = None
        if use_timerfd and _LIBC is not None:
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._watcher = get_hub().loop.io(fd, 1)  # 1 = READ
        self._spec = _Itimerspec()

    @property
    def precise(self) -> bool:
        """True when a timerfd is in use."""
        return self._fd >= 0

    def sleep_until(self, deadline: float) -> None:
        """Yield to other greenlets until ``time.perf_counter() >= deadline``."""
        while (remaining := deadline - time.perf_counter()) > 0:
            if self._fd < 0:
                gevent.sleep(remaining)
                continue
            assert _LIBC is not None
            seconds = int(deadline)
            value = self._spec.it_value
            value.tv_sec = seconds
            value.tv_nsec = min(int((deadline - seconds) * 1e9) + 1, 999_999_999)
            if _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None):
                gevent.sleep(remaining)  # cannot arm: fall back for this wait
                continue
            get_hub().wait(self._watcher)
            try:
                os.read(self._fd, 8)  # the expiry count; re-arms cleanly
            except BlockingIOError:
                pass

    def close(self) -> None:
        """Release the timerfd."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._watcher.close()
            self._watcher = None
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
