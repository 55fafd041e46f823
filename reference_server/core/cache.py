"""The response cache: a size-bounded LRU of responses keyed by model, version and input bytes.

Follows Triton's local cache (``research/triton_spec.md`` §4): the key hashes the model name,
the actual version and, for each input in name order, the name and every byte of the data (not
the datatype or shape); a response larger than the whole cache is refused; inserting evicts the
least recently used entries until the new one fits.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from reference_server.core.types import InferResponse


@dataclass(frozen=True)
class CachedResponse:
    """A stored response: every output the model produced."""

    outputs: dict[str, np.ndarray]
    output_datatypes: dict[str, str]
    byte_size: int


def _tensor_bytes(array: np.ndarray) -> bytes:
    if array.dtype == np.object_:
        parts = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(data).to_bytes(4, "little") + data)
        return b"".join(parts)
    return np.ascontiguousarray(array).tobytes()


def cache_key(model: str, version: str, inputs: Mapping[str, np.ndarray]) -> str:
    """Triton's cache key: a 64-bit hash (decimal string) of model, version and input bytes."""
    h = hashlib.blake2b(digest_size=8)
    h.update(model.encode())
    h.update(b"\0")
    h.update(version.encode())
    for name in sorted(inputs):
        h.update(b"\0")
        h.update(name.encode())
        h.update(b"\0")
        h.update(_tensor_bytes(inputs[name]))
    return str(int.from_bytes(h.digest(), "little"))


class ResponseCache:
    """Size-bounded LRU shared by every model that enables ``response_cache``; thread-safe.

    Args:
        size_bytes: Capacity; entries are sized by their output bytes.
    """

    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes
        self._entries: collections.OrderedDict[str, CachedResponse] = collections.OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self.lookups = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insertion_ns = 0

    def lookup(self, key: str) -> CachedResponse | None:
        """Return the cached response for ``key`` (refreshing its recency) or None."""
        start = time.monotonic_ns()
        with self._lock:
            self.lookups += 1
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self._entries.move_to_end(key)
            self.lookup_ns += time.monotonic_ns() - start
            return entry

    def insert(self, key: str, response: InferResponse) -> bool:
        """Store a response; False when the key was already present or it cannot fit."""
        start = time.monotonic_ns()
        outputs = {name: np.array(arr, copy=True) for name, arr in response.outputs.items()}
        size = sum(len(_tensor_bytes(a)) for a in outputs.values()) + len(key)
        entry = CachedResponse(outputs, dict(response.output_datatypes), size)
        with self._lock:
            try:
                if key in self._entries:
                    return False
                if size > self.size_bytes:
                    return False
                while self._used + size > self.size_bytes and self._entries:
                    _, old = self._entries.popitem(last=False)
                    self._used -= old.byte_size
                    self.evictions += 1
                self._entries[key] = entry
                self._used += size
                return True
            finally:
                self.insertion_ns += time.monotonic_ns() - start

    def gauges(self) -> dict[str, float]:
        """Server-wide values for the ``nv_cache_*`` gauges (durations in µs)."""
        with self._lock:
            return {
                "nv_cache_num_entries": len(self._entries),
                "nv_cache_num_lookups": self.lookups,
                "nv_cache_num_hits": self.hits,
                "nv_cache_num_misses": self.misses,
                "nv_cache_num_evictions": self.evictions,
                "nv_cache_util": self._used / self.size_bytes if self.size_bytes else 0.0,
                "nv_cache_lookup_duration": self.lookup_ns // 1000,
                "nv_cache_insertion_duration": self.insertion_ns // 1000,
            }

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
