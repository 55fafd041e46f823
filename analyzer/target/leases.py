"""Shared-target leases: two workers of one study must not tune the same server.

A server that outlives the sweep (``--url``) may be named by several workers of one study:
:func:`claim_target` keeps a lease per server and model in the study (its user attributes,
through :class:`LeaseStore`) and refuses a second live worker with
:class:`TargetInUseError`; :func:`leased` holds one for the length of a sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from analyzer.config.urls import http_url
from analyzer.errors import TargetError
from analyzer.target.protocol import Target

#: Study user attributes that hold target leases start with this.
LEASE_PREFIX = "perfsweep.target_lease:"
#: A lease not renewed for this long belongs to a worker that is gone.
LEASE_TTL_S = 900.0


class TargetInUseError(TargetError):
    """Another live worker of the same study tunes the same server (``--url``) and model."""


class LeaseStore(Protocol):
    """Where leases live: the study's user attributes (:class:`analyzer.search.study.Search`)."""

    def study_attrs(self) -> dict[str, Any]:
        """Every study user attribute, read now."""
        ...

    def set_study_attr(self, key: str, value: Any) -> None:
        """Write one study user attribute."""
        ...


@dataclass(frozen=True)
class TargetLease:
    """One worker's claim on a server and model, kept in the study.

    Attributes:
        target: ``http://host:port`` of the server.
        model: The model tuned there.
        owner: This worker: ``host:pid:nonce``.
        host: The worker's host name.
        pid: The worker's process id.
        renewed_at: Unix time of the last renewal.
        released: The worker finished: the lease no longer counts.
    """

    target: str
    model: str
    owner: str
    host: str
    pid: int
    renewed_at: float
    released: bool = False

    @property
    def key(self) -> str:
        """Its study attribute: one per (target, model, owner), so claims never overwrite."""
        digest = hashlib.sha1(f"{self.target} {self.model}".encode()).hexdigest()[:12]
        return f"{LEASE_PREFIX}{digest}:{self.owner}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> TargetLease | None:
        """A lease from a study attribute; None for anything else."""
        try:
            return cls(**data)
        except TypeError:
            return None

    def live(self, now: float, ttl_s: float = LEASE_TTL_S) -> bool:
        """Not released, renewed within ``ttl_s``, and (on this host) its process still runs."""
        if self.released or now - self.renewed_at > ttl_s:
            return False
        return self.host != socket.gethostname() or _pid_running(self.pid)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it runs
        return True
    return True


def new_lease(url: str, model: str, now: float) -> TargetLease:
    """This worker's lease on ``url``/``model`` (not yet written)."""
    host, pid = socket.gethostname(), os.getpid()
    return TargetLease(http_url(url), model, f"{host}:{pid}:{uuid.uuid4().hex[:8]}", host, pid, now)


def rival_leases(
    attrs: Mapping[str, Any], mine: TargetLease, now: float, ttl_s: float = LEASE_TTL_S
) -> list[TargetLease]:
    """The live leases of other workers on ``mine``'s server and model."""
    rivals = []
    for key, value in attrs.items():
        if not key.startswith(LEASE_PREFIX):
            continue
        lease = TargetLease.from_dict(value)
        if (
            lease is not None
            and lease.owner != mine.owner
            and (lease.target, lease.model) == (mine.target, mine.model)
            and lease.live(now, ttl_s)
        ):
            rivals.append(lease)
    return rivals


def claim_target(
    store: LeaseStore,
    url: str,
    model: str,
    now: float | None = None,
    ttl_s: float = LEASE_TTL_S,
) -> TargetLease:
    """Claim ``url``/``model`` for this worker in the study, or refuse.

    The claim is written first and the study read after it: of two workers that start together
    at least the later reader sees the other, so two never both go on (both may refuse: start
    them again one after the other). Renew the lease at least every ``ttl_s``
    (:func:`renew_target`) and release it at the end (:func:`release_target`).

    Raises:
        TargetInUseError: another live worker of this study tunes the same server and model;
            the message names it and what to do.
    """
    stamp = time.time() if now is None else now
    mine = new_lease(url, model, stamp)
    store.set_study_attr(mine.key, mine.to_dict())
    rivals = rival_leases(store.study_attrs(), mine, stamp, ttl_s)
    if rivals:
        release_target(store, mine)
        other = rivals[0]
        raise TargetInUseError(
            f"another perfsweep worker of this study (host {other.host}, pid {other.pid}, "
            f"renewed {max(0.0, stamp - other.renewed_at):.0f} s ago) tunes {model!r} on "
            f"{mine.target}: two workers would reload the model under each other. Give each "
            "worker its own server (--url, or a managed one), or start this one when it is done"
        )
    return mine


def renew_target(store: LeaseStore, lease: TargetLease, now: float | None = None) -> TargetLease:
    """The lease renewed (written to the study)."""
    renewed = dataclasses.replace(lease, renewed_at=time.time() if now is None else now)
    store.set_study_attr(renewed.key, renewed.to_dict())
    return renewed


def release_target(store: LeaseStore, lease: TargetLease) -> None:
    """Mark the lease released (study attributes cannot be deleted)."""
    store.set_study_attr(lease.key, dataclasses.replace(lease, released=True).to_dict())


@contextlib.contextmanager
def leased(store: LeaseStore, target: Target) -> Iterator[TargetLease | None]:
    """Hold the study's lease on ``target`` for the block, when it is shared (``--url``); a
    managed server is this worker's own (None). Released however the block ends (Ctrl-C too).

    Raises:
        TargetInUseError: another live worker of the study holds it (:func:`claim_target`).
    """
    if not target.shared:
        yield None
        return
    lease = claim_target(store, target.url, target.model)
    try:
        yield lease
    finally:
        release_target(store, lease)  # the key stays the same across renewals
