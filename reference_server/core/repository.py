"""The model repository on disk: find model directories, read configs, pick versions.

Layout (``research/triton_spec.md`` §2.1)::

    <repository>/<model>/config.pbtxt
    <repository>/<model>/<version>/...      numeric version directories

Several repositories may be given; a model name found in two of them cannot be loaded. A load
may bring its own config (JSON override) and files (``file:<version>/<path>`` → bytes), which
then form a complete model directory of their own.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.config import load_config_file
from reference_server.core.errors import Code, ModelConfigError, ServerError

DUPLICATE_REASON = "model appears in two or more repositories"

#: Characters a model name may not contain: it is one directory name inside a repository.
_FORBIDDEN_IN_NAME = ("/", "\\", "\x00")


def display_name(name: str) -> str:
    """``name`` as it may appear in a message or log line: control characters escaped."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in name)


def poll_failure(name: str, reason: str = "") -> ServerError:
    """Triton's answer to a model it cannot find in the repository (INTERNAL, HTTP 500).

    Args:
        name: The model name as requested.
        reason: Why, appended after a colon (Triton only logs it); never an absolute path.
    """
    message = f"failed to load '{display_name(name)}', failed to poll from model repository"
    return ServerError(f"{message}: {reason}" if reason else message, Code.INTERNAL)


def check_model_name(name: str) -> None:
    """Refuse a model name that is not one plain directory name.

    A name reaches the filesystem as ``<repository>/<name>``, so separators, ``.``/``..``,
    NUL and empty names would address something other than a model directory.

    Raises:
        ServerError: INTERNAL ``failed to poll from model repository``, as Triton answers for
            any name it does not find.
    """
    if (
        not name
        or name in (".", "..")
        or any(ch in name for ch in _FORBIDDEN_IN_NAME)
        or Path(name).is_absolute()
    ):
        raise poll_failure(
            name,
            "a model name is one directory name: it must not be empty, '.' or '..', nor "
            "contain '/', '\\' or NUL",
        )


def inside(base: Path, relative: str | Path, what: str, *, resolve_links: bool = True) -> Path:
    """``base / relative``, refused if it leaves ``base``.

    Args:
        base: The directory the path must stay in (a model directory).
        relative: The path as a config gives it.
        what: What the path is, for the message (e.g. ``"label file"``).
        resolve_links: Resolve symlinks before the check (for what a client names directly:
            the model directory, config.pbtxt). Without it the check is on the path as written
            (absolute paths and ``..`` refused), so links the operator put inside the model
            directory still work (the bundled model links its ONNX file from a cache).

    Raises:
        ModelConfigError: the path leaves ``base``; the message names ``relative`` only, never
            an absolute path of the server.
    """
    shown = (
        "(an absolute path)" if Path(relative).is_absolute() else f"'{display_name(str(relative))}'"
    )
    refused = ModelConfigError(
        f"{what} {shown} is outside the model directory: give a path "
        "relative to the model directory, without '..'"
        + (" or links that leave it" if resolve_links else "")
    )
    if "\x00" in str(relative):
        raise refused
    if not resolve_links:
        rel = Path(relative)
        if rel.is_absolute() or ".." in rel.parts:
            raise refused
        return base / rel
    root = base.resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise refused
    return target


@dataclass(frozen=True)
class ModelSource:
    """What a load starts from: the raw (not normalized) config and the model directory.

    Attributes:
        name: Model name.
        directory: The model directory (the versions live below it).
        config: Parsed config, before normalization.
        from_override: The config came from a load override rather than config.pbtxt.
        fingerprint: Paths, sizes and modification times of the model's files, so a plain
            load can tell whether anything changed on disk since the last one.
    """

    name: str
    directory: Path
    config: mc.ModelConfig
    from_override: bool = False
    fingerprint: tuple[tuple[str, int, int], ...] = ()


class ModelRepository:
    """One or more repository directories.

    Args:
        paths: Repository roots, searched in order.
    """

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._scratch: list[tempfile.TemporaryDirectory[str]] = []
        self._scratch_lock = threading.Lock()  # loads of different names run concurrently

    def names(self) -> list[str]:
        """Every model directory name found in any repository, sorted."""
        found: set[str] = set()
        for root in self.paths:
            if root.is_dir():
                found.update(
                    p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                )
        return sorted(found)

    def locate(self, name: str) -> Path:
        """The directory of model ``name``.

        Raises:
            ServerError: INTERNAL ``failed to poll`` when absent; INVALID_ARG when duplicated.
        """
        check_model_name(name)
        hits = [root / name for root in self.paths if (root / name).is_dir()]
        if not hits:
            raise poll_failure(name)
        if len(hits) > 1:
            raise ModelConfigError(DUPLICATE_REASON)
        directory = hits[0]
        root = directory.parent.resolve()
        if directory.resolve().parent != root:
            # A symlink in the repository that points elsewhere: what it points to was not put
            # in the repository, so it is not served.
            raise poll_failure(name, "the model directory is a link that leaves the repository")
        return directory

    def read(
        self,
        name: str,
        override: mc.ModelConfig | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> ModelSource:
        """Read a model's config (or take the override) and find its directory.

        Raises:
            ServerError: the model name is invalid or not in any repository, or it has no
                config.pbtxt (or one that is a link leaving the model directory).
        """
        check_model_name(name)
        if files:
            if override is None:
                raise ModelConfigError(
                    f"failed to load '{name}', failed to poll from model repository: "
                    "model config must be provided when providing model files"
                )
            return ModelSource(name, self._materialize(name, files), override, True)
        directory = self.locate(name)
        if override is not None:
            return ModelSource(name, directory, override, True)
        path = directory / "config.pbtxt"
        if not path.is_file():
            raise ModelConfigError(
                f"failed to load '{name}': no config.pbtxt in the model directory '{name}' "
                "(this server does not auto-complete configs)"
            )
        path = inside(directory, "config.pbtxt", "config file")
        return ModelSource(name, directory, load_config_file(path), False, fingerprint(directory))

    def _materialize(self, name: str, files: Mapping[str, bytes]) -> Path:
        scratch = tempfile.TemporaryDirectory(prefix=f"override-{name}-")
        root = Path(scratch.name) / name
        try:
            root.mkdir(parents=True)
            for key, data in files.items():
                rel = key.removeprefix("file:")
                target = (root / rel).resolve()
                if root.resolve() not in target.parents:
                    raise ModelConfigError(
                        f"invalid file path '{rel}' in load request for '{name}'"
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except BaseException:
            scratch.cleanup()
            raise
        with self._scratch_lock:
            self._scratch.append(scratch)
        return root

    def discard(self, source: ModelSource) -> None:
        """Delete the directory made from a load's files (the load failed: nothing uses it).

        A source read from the repository itself is left alone.
        """
        with self._scratch_lock:
            found = [s for s in self._scratch if source.directory.parent == Path(s.name)]
            for scratch in found:
                self._scratch.remove(scratch)
        for scratch in found:
            scratch.cleanup()

    def close(self) -> None:
        """Delete directories made from load-request files."""
        with self._scratch_lock:
            scratches, self._scratch = self._scratch, []
        for scratch in scratches:
            scratch.cleanup()


def fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """``(relative path, size, mtime_ns)`` of every file below ``directory``, sorted."""
    entries = []
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                st = path.stat()
                entries.append((str(path.relative_to(directory)), st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return tuple(sorted(entries))


def version_numbers(directory: Path) -> list[int]:
    """The version folders of a model directory (``1/``, ``2/``...) as numbers, ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def select_versions(config: mc.ModelConfig, directory: Path) -> list[tuple[str, Path]]:
    """The versions to load under the config's version policy, ascending.

    Raises:
        ModelConfigError: no version directory matches the policy.
    """
    present = version_numbers(directory)
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = present
    elif which == "specific":
        chosen = [v for v in present if v in set(policy.specific.versions)]
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = present[-max(1, count) :]
    if not chosen:
        raise ModelConfigError(
            f"at least one version must be available under the version policy of model "
            f"'{config.name}'"
        )
    return [(str(v), directory / str(v)) for v in chosen]
