"""One matplotlib figure as inline SVG text: :class:`Figure`, the report's style and colours.

Every id inside a figure's SVG is prefixed with the figure's name, so the ids matplotlib generates
(``axes_1``, clip paths, markers) do not collide when several figures sit inline in one page; a
fixed ``svg.hashsalt`` keeps the output deterministic.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: reports are rendered on servers and in CI

import matplotlib.pyplot as plt
from matplotlib.figure import Figure as MplFigure

#: Colours: baseline grey, best green, other feasible blue, infeasible red (colour-blind safe-ish).
BASELINE = "#6b6b6b"
BEST = "#1a9850"
FEASIBLE = "#2c7fb8"
INFEASIBLE = "#d7301f"
SECONDARY = "#fdae61"

_STYLE: Any = {
    "figure.dpi": 100,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text: smaller files, selectable labels
}


@dataclass(frozen=True)
class Figure:
    """One rendered figure.

    Attributes:
        name: Stable identifier (``data-figure`` attribute in the HTML).
        svg: The ``<svg>`` element (no XML prolog).
        alt: What the figure shows, for screen readers and text browsers.
    """

    name: str
    svg: str
    alt: str


def to_svg(fig: MplFigure, name: str) -> str:
    """Serialise and close a figure; the SVG's ids are salted with ``name``."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": name}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return _prefix_ids(text[text.index("<svg") :], name)


_ID_REF = re.compile(r'(id="|href="#|url\(#)([^"()]+)')


def _prefix_ids(svg: str, prefix: str) -> str:
    """Prefix every id (and every reference to one) so inline figures never share an id.

    Matplotlib names groups ``figure_1``, ``axes_1``, ``PathCollection_1`` in every figure, which
    would repeat across several inline SVGs in one page.
    """
    ids = set(re.findall(r'id="([^"]+)"', svg))

    def swap(match: re.Match[str]) -> str:
        head, name = match.groups()
        return f"{head}{prefix}-{name}" if name in ids else match.group(0)

    return _ID_REF.sub(swap, svg)


def new_figure(width: float = 6.4, height: float = 3.6, ncols: int = 1) -> tuple[MplFigure, list]:
    """A figure with ``ncols`` axes in one row, in the report's style."""
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def styled(build: Callable[[], Figure | None]) -> Figure | None:
    """Run a figure builder under the report's matplotlib style."""
    with plt.rc_context(_STYLE):
        return build()
