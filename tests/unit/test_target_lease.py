"""The shared-target lease: two workers of one study on the same ``--url`` and model are
refused (the second one, or both when they start together), never both let through; released,
expired and dead leases do not count. A dict plays the study, then two real Optuna studies on
one journal file play two workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analyzer.search.space import SearchSpace
from analyzer.search.study import Search
from analyzer.target.leases import (
    LEASE_TTL_S,
    TargetInUseError,
    TargetLease,
    claim_target,
    leased,
    new_lease,
    release_target,
    renew_target,
    rival_leases,
)
from analyzer.target.managed import ManagedServer
from analyzer.target.remote import RemoteTarget

URL = "http://127.0.0.1:8000"


class DictStore:
    """A study's user attributes in memory."""

    def __init__(self) -> None:
        self.attrs: dict[str, Any] = {}

    def study_attrs(self) -> dict[str, Any]:
        return dict(self.attrs)

    def set_study_attr(self, key: str, value: Any) -> None:
        self.attrs[key] = value


def other_worker(now: float, **changes: Any) -> TargetLease:
    """A lease of another live worker on this host (its pid: this test process's parent)."""
    fields = {
        "target": URL,
        "model": "m",
        "owner": "elsewhere:1:abcd",
        "host": socket.gethostname(),
        "pid": os.getppid(),
        "renewed_at": now,
    }
    fields.update(changes)
    return TargetLease(**fields)


def test_a_second_worker_on_the_same_server_and_model_is_refused() -> None:
    store = DictStore()
    first = claim_target(store, "127.0.0.1:8000", "m", now=1000.0)
    assert first.target == URL and first.pid == os.getpid()
    with pytest.raises(
        TargetInUseError, match=r"tunes 'm' on http://127\.0\.0\.1:8000.*own server"
    ):
        claim_target(store, URL, "m", now=1001.0)
    # The refused claim was released at once: it blocks nobody.
    released = [TargetLease.from_dict(v) for v in store.attrs.values()]
    assert sum(1 for lease in released if lease and not lease.released) == 1
    # Another model, or another server, is no conflict.
    claim_target(store, URL, "other", now=1001.0)
    claim_target(store, "http://127.0.0.1:8001", "m", now=1001.0)


@pytest.mark.usefixtures("spawns")
def test_released_expired_and_dead_leases_do_not_count() -> None:
    now = 10_000.0
    mine = new_lease(URL, "m", now)
    live = other_worker(now - 5)
    attrs = {
        live.key: live.to_dict(),
        "unrelated": {"x": 1},
        other_worker(now, owner="a:2:x", released=True).key: other_worker(
            now, owner="a:2:x", released=True
        ).to_dict(),
        other_worker(now - LEASE_TTL_S - 1, owner="b:3:y").key: other_worker(
            now - LEASE_TTL_S - 1, owner="b:3:y"
        ).to_dict(),
    }
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = other_worker(now, owner="c:4:z", pid=int(dead.stdout))
    attrs[gone.key] = gone.to_dict()
    far = other_worker(now, owner="d:5:w", host="another-host", pid=1)
    attrs[far.key] = far.to_dict()
    assert rival_leases(attrs, mine, now) == [live, far]


def test_renew_keeps_a_lease_live_and_release_frees_the_server() -> None:
    store = DictStore()
    lease = claim_target(store, URL, "m", now=0.0)
    lease = renew_target(store, lease, now=LEASE_TTL_S)
    with pytest.raises(TargetInUseError):
        claim_target(store, URL, "m", now=LEASE_TTL_S + 10)  # renewed: still live
    release_target(store, lease)
    assert claim_target(store, URL, "m", now=LEASE_TTL_S + 20).model == "m"


def test_two_workers_starting_together_never_both_go_on() -> None:
    # Both write before either reads: both see a rival and refuse, which is safe.
    store = DictStore()
    a, b = new_lease(URL, "m", 1.0), new_lease(URL, "m", 1.0)
    store.set_study_attr(a.key, a.to_dict())
    store.set_study_attr(b.key, b.to_dict())
    assert rival_leases(store.study_attrs(), a, 1.0) == [b]
    assert rival_leases(store.study_attrs(), b, 1.0) == [a]


def test_two_searches_on_one_journal_see_each_others_lease(tmp_path: Path) -> None:
    space = SearchSpace.from_bounds((1, 8), (0, 1000), 3, "auto", (1, 2))
    journal = str(tmp_path / "study.journal")
    worker_a = Search(space, ["maximize"], journal, "shared")
    worker_b = Search(space, ["maximize"], journal, "shared")
    lease = claim_target(worker_a, URL, "m")
    with pytest.raises(TargetInUseError, match="another perfsweep worker of this study"):
        claim_target(worker_b, URL, "m")
    release_target(worker_a, lease)
    claim_target(worker_b, URL, "m")
    assert any(k.startswith("perfsweep.target_lease:") for k in worker_a.study_attrs())


def test_leased_holds_a_shared_target_for_the_block_only() -> None:
    store = DictStore()
    remote = RemoteTarget(URL, "m")
    with leased(store, remote) as lease:
        assert lease is not None and lease.target == URL
        with pytest.raises(TargetInUseError), leased(store, RemoteTarget(URL, "m")):
            pass
    with pytest.raises(KeyboardInterrupt), leased(store, remote):
        raise KeyboardInterrupt  # released on Ctrl-C too
    with leased(store, remote) as again:
        assert again is not None
    managed = ManagedServer("m", "sim", Path("server.log"))
    with leased(store, managed) as none:
        assert none is None
