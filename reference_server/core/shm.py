"""System shared-memory regions registered by clients (Triton's ``SharedMemoryManager``).

A client creates a POSIX shared-memory object (``shm_open``; on Linux a file under
``/dev/shm``), registers ``byte_size`` bytes of it from ``offset`` under a region *name*, and
then names the region in inference requests instead of sending tensor bytes: inputs are read
from it and outputs written into it. Both frontends share one :class:`SharedMemoryRegistry`
(the server owns it), so a region registered over HTTP serves gRPC requests too.

Lifetime: a region is an ``mmap`` of its slice. Unregistering drops the registry's reference;
the mapping itself goes away when the last request holding a :class:`RegionSlice` of it is
done (CPython's reference counting), so an unregister never pulls memory from under a running
request -- Triton defers such an unregister the same way.

Errors are ``ServerError`` with Triton's codes and messages (checked against Triton 2.51). One
2.51 bug is not reproduced: there, registering a second region on a key that is already
registered reuses a closed descriptor and fails with ``Invalid shared memory region: '<key>'``
(INTERNAL); here it works, as in later Tritons.

CUDA shared memory is never registered: this server holds no CUDA context. The ``cuda_*``
methods answer as Triton built with GPU support answers on a machine where the handle cannot
be opened (the nvidia-pytriton wheel's Triton on a CPU-only host), so a client gets a clear
INVALID_ARG instead of a 404.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass

from reference_server.core.errors import Code, ServerError

#: Where Linux's ``shm_open`` keeps its objects.
SHM_DIR = "/dev/shm"

#: Size of a ``cudaIpcMemHandle_t``: a CUDA register request's handle must decode to this.
CUDA_IPC_HANDLE_SIZE = 64


@dataclass(frozen=True)
class RegionStatus:
    """One registered system region as the status call reports it."""

    name: str
    key: str
    offset: int
    byte_size: int

    def to_json(self) -> dict[str, str | int]:
        """The HTTP status entry, in Triton's key order."""
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(frozen=True, eq=False)
class RegionSlice:
    """``byte_size`` bytes at ``offset`` inside a registered region, checked to be in bounds.

    It keeps the region's mapping alive while a request uses it, even if the region is
    unregistered meanwhile.
    """

    region: str
    offset: int
    byte_size: int
    _mapping: mmap.mmap

    def view(self) -> memoryview:
        """The slice's bytes, without a copy (writes go to the client's memory)."""
        return memoryview(self._mapping)[self.offset : self.offset + self.byte_size]

    def write(self, data: bytes | memoryview) -> None:
        """Copy ``data`` to the start of the slice; the caller checked that it fits."""
        end = self.offset + len(data)
        self._mapping[self.offset : end] = data


@dataclass(frozen=True, eq=False)
class _Region:
    status: RegionStatus
    mapping: mmap.mmap


class SharedMemoryRegistry:
    """Thread-safe map of region name -> mapped system shared memory.

    Every method may be called from any thread (the frontends call it from the event loop,
    tests from their own threads).
    """

    def __init__(self, shm_dir: str = SHM_DIR) -> None:
        self._shm_dir = shm_dir
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    # -- system shared memory ----------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes of the shared-memory object ``key`` from ``offset``.

        Raises:
            ServerError: ALREADY_EXISTS for a taken name; INTERNAL when ``key`` cannot be
                opened; INVALID_ARG when the slice does not lie inside the object or cannot be
                mapped (``offset`` must be a multiple of the page size; ``byte_size`` > 0).
        """
        with self._lock:
            if name in self._regions:
                raise ServerError(
                    f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS
                )
            mapping = self._map(name, key, offset, byte_size)
            self._regions[name] = _Region(RegionStatus(name, key, offset, byte_size), mapping)

    def _map(self, name: str, key: str, offset: int, byte_size: int) -> mmap.mmap:
        fd = self._open(key)
        try:
            try:
                size = os.fstat(fd).st_size
            except OSError:
                raise ServerError(f"Invalid shared memory region: '{key}'", Code.INTERNAL) from None
            if offset + byte_size > size:
                raise ServerError(
                    f"failed to register shared memory region '{name}': invalid args",
                    Code.INVALID_ARG,
                )
            # mmap(2) refuses a zero length and an offset off a page boundary with EINVAL;
            # Python's mmap would map the whole object for length 0, so refuse it here.
            if byte_size == 0 or offset % mmap.ALLOCATIONGRANULARITY:
                raise _map_failed(name, "Invalid argument")
            try:
                return mmap.mmap(
                    fd,
                    byte_size,
                    flags=mmap.MAP_SHARED,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                    offset=offset,
                )
            except (OSError, ValueError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise _map_failed(name, reason) from None
        finally:
            os.close(fd)

    def _open(self, key: str) -> int:
        # shm_open's rules on Linux: one leading slash, no other, not empty.
        bare = key[1:] if key.startswith("/") else key
        if bare and "/" not in bare and bare not in (".", ".."):
            try:
                return os.open(os.path.join(self._shm_dir, bare), os.O_RDWR)
            except OSError:
                pass
        raise ServerError(f"Unable to open shared memory region: '{key}'", Code.INTERNAL)

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region, by name as Triton's ``std::map`` lists them (``name`` empty), or the one
        named.

        Raises:
            ServerError: NOT_FOUND for a name that is not registered.
        """
        with self._lock:
            if not name:
                return [self._regions[key].status for key in sorted(self._regions)]
            region = self._regions.get(name)
        if region is None:
            raise ServerError(
                f"Unable to find system shared memory region: '{name}'", Code.NOT_FOUND
            )
        return [region.status]

    def unregister(self, name: str = "") -> None:
        """Forget one region (``name``) or all of them; an unknown name is not an error."""
        with self._lock:
            if name:
                self._regions.pop(name, None)
            else:
                self._regions.clear()

    def slice(self, name: str, offset: int, byte_size: int) -> RegionSlice:
        """The part of region ``name`` that a request names, bounds-checked as Triton does.

        ``offset`` is relative to the region's start. A ``byte_size`` of 0 is refused like an
        overrun (Triton 2.51 computes ``offset + byte_size - 1``, which wraps around).

        Raises:
            ServerError: NOT_FOUND for an unknown region; INVALID_ARG for an offset or size
                outside it.
        """
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise ServerError(f"Unable to find shared memory region: '{name}'", Code.NOT_FOUND)
        size = region.status.byte_size
        if not 0 <= offset < size:
            raise ServerError(
                f"Invalid offset for shared memory region: '{name}'", Code.INVALID_ARG
            )
        if byte_size <= 0 or offset + byte_size > size:
            raise ServerError(
                f"Invalid offset + byte size for shared memory region: '{name}'",
                Code.INVALID_ARG,
            )
        return RegionSlice(name, offset, byte_size, region.mapping)

    def close(self) -> None:
        """Drop every region (server shutdown); mappings in use live until their request ends."""
        self.unregister()

    # -- CUDA shared memory (never registered here) ------------------------------------------

    def cuda_status(self, name: str = "") -> list[RegionStatus]:
        """No CUDA region exists: all -> ``[]``; a name -> NOT_FOUND, as Triton words it."""
        if not name:
            return []
        with self._lock:
            system = name in self._regions
        if system:
            raise ServerError(
                f"The region named '{name}' is registered as system shared memory, not CUDA "
                "shared memory",
                Code.NOT_FOUND,
            )
        raise ServerError(f"Unable to find cuda shared memory region: '{name}'", Code.NOT_FOUND)

    def cuda_register(self, name: str) -> None:
        """Refuse a CUDA registration as a GPU-enabled Triton that cannot open the handle.

        Raises:
            ServerError: ALREADY_EXISTS for a taken name, else INVALID_ARG.
        """
        with self._lock:
            taken = name in self._regions
        if taken:
            raise ServerError(
                f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS
            )
        raise ServerError("failed to register shared memory region: invalid args", Code.INVALID_ARG)


def _map_failed(name: str, reason: str) -> ServerError:
    # Triton's wording, its missing space included ("...address spaceInvalid argument").
    return ServerError(
        f"failed to register shared memory region '{name}': unable to process address space"
        f"{reason}",
        Code.INVALID_ARG,
    )
