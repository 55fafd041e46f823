"""Request inputs in system shared memory, as perf_analyzer's ``--shared-memory system`` sends them.

Every distinct payload of a rotation is written once into one POSIX shared-memory segment,
which is registered with the server as one region; a request then names its tensors by offset
and size in that region instead of carrying their bytes. A 600 KB image costs the generator a
few hundred bytes of request, so it measures the server rather than its own copying.

Pure ``tritonclient`` + numpy (no gevent): the client that registers the region is passed in,
an HTTP or a gRPC ``InferenceServerClient``, and the ``InferInput`` objects handed out are of the
same protocol. The server must run on this host (it maps ``/dev/shm/<key>``).

Typical use::

    with ShmInputs(client, payloads) as shm:
        for index in range(len(shm)):
            client.infer(model, shm.inputs(index))

``close()`` unregisters the region and unlinks the segment; it runs on any construction
failure too, is idempotent, and is safe after the server has gone away.
"""

from __future__ import annotations

import importlib
import itertools
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import (
    InferenceServerException,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

from analyzer.errors import InputError, TargetError

#: Where Linux keeps POSIX shared memory; its free space bounds the segment.
SHM_DIR = "/dev/shm"
#: Each tensor starts on this boundary inside the segment (cache lines; numpy-friendly).
ALIGNMENT = 64

_sequence = itertools.count()


class ShmClient(Protocol):
    """The part of ``tritonclient.{http,grpc}.InferenceServerClient`` this module calls."""

    def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0, headers: Any = None
    ) -> Any: ...

    def unregister_system_shared_memory(self, name: str = "", headers: Any = None) -> Any: ...


@dataclass(frozen=True)
class TensorPlace:
    """Where one tensor of one payload lies in the region."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int
    byte_size: int


class ShmInputs:
    """One shared-memory segment holding a rotation's payloads, registered with a server.

    Args:
        client: HTTP or gRPC ``InferenceServerClient`` of the server that reads the region.
        payloads: The rotation (``name -> array`` per request). A payload that is the same
            object as an earlier one (a repeat) is written once and shares its place.
        datatypes: Triton datatype per input name; default: from each array's numpy dtype
            (object arrays are BYTES).
        name_prefix: Start of the region name and segment key (a unique suffix is added).
        shm_dir: Where the segment's space is checked (``/dev/shm`` on Linux).
        headers: Sent with the register and unregister calls (a restricted shared-memory API).

    Raises:
        InputError: no payloads, or ``/dev/shm`` has too little free space for them.
        TargetError: the server refused the region (typically: it runs on another host).
    """

    def __init__(
        self,
        client: ShmClient,
        payloads: Sequence[Mapping[str, np.ndarray]],
        *,
        datatypes: Mapping[str, str] | None = None,
        name_prefix: str = "perfsweep",
        shm_dir: str = SHM_DIR,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not payloads:
            raise InputError("shared-memory inputs need at least one payload")
        self._client = client
        self._headers = dict(headers) if headers else None
        self._module = _client_module(client)
        suffix = f"{os.getpid()}_{next(_sequence)}_{uuid.uuid4().hex[:8]}"
        self.region_name = f"{name_prefix}_{suffix}"
        self.key = f"/{name_prefix}_{suffix}"
        self._handle: Any = None
        self._registered = False
        self._closed = False

        blobs: dict[int, list[tuple[TensorPlace, np.ndarray]]] = {}
        self._places: list[tuple[TensorPlace, ...]] = []
        size = 0
        for payload in payloads:
            known = blobs.get(id(payload))
            if known is None:
                known = []
                for name, array in payload.items():
                    datatype = (datatypes or {}).get(name) or np_to_triton_dtype(array.dtype)
                    data = _raw(datatype, array)
                    place = TensorPlace(name, datatype, tuple(array.shape), size, data.nbytes)
                    known.append((place, data))
                    size = _aligned(size + max(data.nbytes, 1))
                blobs[id(payload)] = known
            self._places.append(tuple(place for place, _ in known))
        self.byte_size = size
        _check_space(shm_dir, size)

        try:
            self._handle = shm.create_shared_memory_region(
                self.region_name, self.key, size, create_only=True
            )
            for items in blobs.values():
                for place, data in items:
                    shm.set_shared_memory_region(self._handle, [data], offset=place.offset)
            self._register()
            self._inputs = [self._build(places) for places in self._places]
        except BaseException:
            self.close()
            raise

    def _register(self) -> None:
        try:
            self._client.register_system_shared_memory(
                self.region_name, self.key, self.byte_size, headers=self._headers
            )
        except InferenceServerException as exc:
            raise TargetError(
                f"the server refused shared-memory region '{self.region_name}' "
                f"({self.byte_size} bytes at {self.key}): {exc.message()}. System shared "
                "memory needs the server on this host; drop --shared-memory for a remote one."
            ) from exc
        self._registered = True

    def _build(self, places: Sequence[TensorPlace]) -> list[Any]:
        tensors = []
        for place in places:
            tensor = self._module.InferInput(place.name, list(place.shape), place.datatype)
            tensor.set_shared_memory(self.region_name, place.byte_size, offset=place.offset)
            tensors.append(tensor)
        return tensors

    def __len__(self) -> int:
        return len(self._places)

    def inputs(self, index: int) -> list[Any]:
        """The ``InferInput`` objects of payload ``index``, referencing the region (reusable)."""
        return self._inputs[index]

    def places(self, index: int) -> tuple[TensorPlace, ...]:
        """Where payload ``index``'s tensors lie in the region."""
        return self._places[index]

    def read(self, index: int, name: str) -> np.ndarray:
        """Tensor ``name`` of payload ``index`` as the server reads it (a check for tests).

        BYTES tensors come back as their serialized bytes (``uint8``).
        """
        for place in self._places[index]:
            if place.name == name:
                dtype = (
                    np.uint8 if place.datatype == "BYTES" else triton_to_np_dtype(place.datatype)
                )
                shape = [place.byte_size] if place.datatype == "BYTES" else list(place.shape)
                return shm.get_contents_as_numpy(self._handle, dtype, shape, offset=place.offset)
        raise KeyError(name)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Unregister the region and unlink the segment; idempotent, never raises for a gone
        server (the segment is unlinked regardless)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._registered:
                self._registered = False
                try:
                    self._client.unregister_system_shared_memory(
                        self.region_name, headers=self._headers
                    )
                except Exception:  # the server may be gone: unlink anyway
                    pass
        finally:
            handle, self._handle = self._handle, None
            if handle is not None:
                shm.destroy_shared_memory_region(handle)

    def __enter__(self) -> ShmInputs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _client_module(client: object) -> Any:
    """``tritonclient.grpc`` or ``tritonclient.http``: the module of ``client``'s protocol."""
    name = type(client).__module__
    return importlib.import_module(
        "tritonclient.grpc" if name.startswith("tritonclient.grpc") else "tritonclient.http"
    )


def _raw(datatype: str, array: np.ndarray) -> np.ndarray:
    """The tensor in Triton's raw layout, as an array ``set_shared_memory_region`` copies."""
    if datatype == "BYTES":
        serialized = serialize_byte_tensor(np.asarray(array, dtype=object))
        item = serialized.item() if serialized.size else b""
        return np.frombuffer(item, dtype=np.uint8)
    return np.ascontiguousarray(array)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _check_space(shm_dir: str, needed: int) -> None:
    # A segment larger than the tmpfs's free space is created fine and then kills the process
    # with SIGBUS on the first write past it: refuse it up front.
    try:
        stats = os.statvfs(shm_dir)
    except OSError:
        return  # not Linux-like; the create call reports what goes wrong
    free = stats.f_bavail * stats.f_frsize
    if needed > free:
        raise InputError(
            f"the payloads need {needed} bytes of shared memory but {shm_dir} has {free} "
            "free: send fewer unique payloads, or give the container more (docker "
            "--shm-size)"
        )
