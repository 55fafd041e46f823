"""The response cache: a size-bounded LRU of responses keyed by model, version and input bytes.

Follows Triton's local cache (``research/triton_spec.md`` §4): the key hashes the model name,
the actual version and, for each input in name order, the name and every byte of the data (not
the datatype or shape); a response larger than the whole cache is refused; inserting evicts the
least recently used entries until the new one fits.

:func:`parse_cache_config` reads ``--cache-config`` values as ``tritonserver`` does (checked
against the real Triton 2.51 of the ``nvidia-pytriton`` wheel): each value is
``<cache name>,<setting>=<value>`` split at the first comma and the first ``=`` (so
``local,size=1,x=2`` is the setting ``size`` with the value ``1,x=2``; more settings take more
flags), a repeated setting keeps the last value, one cache name only, and the ``local`` cache
needs a ``size`` in bytes and ignores other settings. Triton's ``size`` is read with ``stoull``
(``1048576x`` passes, ``abc`` fails with "stoull"); here it must be a whole number of bytes.

Errors: :class:`CacheConfigError` (a :class:`~reference_server.core.errors.ServerError`,
INVALID_ARG), raised by :func:`parse_cache_config` and :func:`resolve_cache_size`.
"""

from __future__ import annotations

import collections
import hashlib
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferResponse

#: The one cache implementation the reference server has (Triton's ``libtritoncache_local``).
LOCAL_CACHE = "local"
_DIGITS = re.compile("[0-9]+")
_FORMAT = "--cache-config option format is '<cache name>,<setting>=<value>'. Got {}"


class CacheConfigError(ServerError):
    """A ``--cache-config`` / ``--cache-size`` value the server cannot start with."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Code.INVALID_ARG)


@dataclass(frozen=True)
class CacheConfig:
    """One cache's settings from ``--cache-config`` flags.

    Attributes:
        name: The cache implementation (only ``local`` is served).
        settings: Setting -> value as given (the last of a repeated setting).
    """

    name: str
    settings: tuple[tuple[str, str], ...]

    @property
    def size_bytes(self) -> int:
        """The ``local`` cache's ``size`` setting.

        Raises:
            CacheConfigError: no ``size``, not a whole number, or 0 (Triton cannot make a
                0-byte buffer either).
        """
        values = dict(self.settings)
        if "size" not in values:
            raise CacheConfigError(
                "Failed to initialize LocalCache: config didn't contain a valid 'size' field: "
                f"pass --cache-config={self.name},size=BYTES"
            )
        text = values["size"]
        if not _DIGITS.fullmatch(text) or int(text) == 0:
            raise CacheConfigError(
                f"Failed to initialize LocalCache: size '{text}' is not a positive whole number "
                f"of bytes: pass --cache-config={self.name},size=BYTES (e.g. size=1048576)"
            )
        return int(text)


def parse_cache_config(values: Sequence[str]) -> CacheConfig | None:
    """The cache ``--cache-config`` flags configure; None when there are none.

    Raises:
        CacheConfigError: a value not of the form ``<cache name>,<setting>=<value>``, two cache
            names, or a cache other than ``local`` (each with what to pass instead).
    """
    caches: dict[str, dict[str, str]] = {}
    for value in values:
        name, comma, rest = value.partition(",")
        setting, equals, setting_value = rest.partition("=")
        if not (name and comma):  # tritonserver's first check: a name, then a comma
            raise CacheConfigError(
                "No cache specified. --cache-config option format is "
                f"<cache name>,<setting>=<value>. Got {value}"
            )
        if not (comma and equals and setting and setting_value):
            raise CacheConfigError(_FORMAT.format(value))
        caches.setdefault(name, {})[setting] = setting_value
    if not caches:
        return None
    if len(caches) > 1:
        raise CacheConfigError(
            "found multiple cache configurations, but only a single cache is currently "
            f"supported (got {', '.join(sorted(caches))})"
        )
    [(name, settings)] = caches.items()
    if name != LOCAL_CACHE:
        raise CacheConfigError(
            f"unable to find cache '{name}': the reference server has only the "
            f"'{LOCAL_CACHE}' cache (--cache-config={LOCAL_CACHE},size=BYTES)"
        )
    return CacheConfig(name, tuple(settings.items()))


def resolve_cache_size(cache_size_bytes: int, cache_config: Sequence[str]) -> int:
    """The response cache size from ``--cache-size`` or ``--cache-config``; 0 = no cache.

    Raises:
        CacheConfigError: both flags given (Triton refuses ``--response-cache-byte-size`` with
            ``--cache-config`` alike), a negative ``--cache-size``, or a bad ``--cache-config``.
    """
    if cache_size_bytes < 0:
        raise CacheConfigError(
            f"--cache-size {cache_size_bytes} must be a number of bytes >= 0 (0 = no cache)"
        )
    config = parse_cache_config(cache_config)
    if config is None:
        return cache_size_bytes
    if cache_size_bytes:
        raise CacheConfigError(
            "Incompatible flags --cache-size and --cache-config both provided. Please provide "
            "one or the other."
        )
    return config.size_bytes


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
