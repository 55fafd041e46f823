"""A file planted outside the model repository, to prove the server never reads it.

The file holds a unique marker. Two checks, because either alone can be fooled: the marker must
never appear in any reply, and the file's access time must not move. The atime check only counts
where the filesystem updates access times (``relatime`` does once atime <= mtime, so the
planted atime is set before the mtime); :meth:`Sentinel.atime_works` tells whether it does.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: An identity model config; ``{name}`` and ``{marker}`` are filled in.
EVIL_CONFIG = """name: "{name}"
backend: "identity" max_batch_size: 8
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] label_filename: "labels.txt" }}
parameters {{ key: "marker" value {{ string_value: "{marker}" }} }}
"""


@dataclass
class Sentinel:
    """Model directories and files outside the repository that must stay unread.

    Attributes:
        root: The directory beside the repository holding the planted files.
        marker: The unique text inside every planted file.
        files: Every planted file (configs, labels, a profile).
    """

    root: Path
    marker: str = field(default_factory=lambda: f"SENTINEL-{uuid.uuid4().hex}")
    files: list[Path] = field(default_factory=list)
    _atimes: dict[Path, int] = field(default_factory=dict)

    def plant_model(self, directory: str, model_name: str) -> Path:
        """``root/directory/{config.pbtxt,labels.txt,profile.toml,1/}``; returns the directory."""
        model_dir = self.root / directory
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        config = model_dir / "config.pbtxt"
        config.write_text(EVIL_CONFIG.format(name=model_name, marker=self.marker))
        labels = model_dir / "labels.txt"
        labels.write_text(f"{self.marker}\n" * 4)
        profile = model_dir / "profile.toml"
        profile.write_text(f'provenance = "{self.marker}"\n[device]\nfixed_ms = 1\n')
        self.files += [config, labels, profile]
        return model_dir

    def arm(self) -> None:
        """Set every planted file's atime one hour before its mtime and remember it."""
        for path in self.files:
            st = path.stat()
            os.utime(path, ns=(st.st_mtime_ns - 3600 * 10**9, st.st_mtime_ns))
            self._atimes[path] = path.stat().st_atime_ns

    def read_files(self) -> list[Path]:
        """Planted files whose access time moved since :meth:`arm`."""
        return [p for p, atime in self._atimes.items() if p.stat().st_atime_ns != atime]

    def atime_works(self, scratch: Path) -> bool:
        """Whether reading a file moves its atime on this filesystem (else only the marker
        check means anything)."""
        probe = scratch / "atime-probe"
        probe.write_text("x")
        st = probe.stat()
        os.utime(probe, ns=(st.st_mtime_ns - 3600 * 10**9, st.st_mtime_ns))
        before = probe.stat().st_atime_ns
        probe.read_text()
        return probe.stat().st_atime_ns != before
