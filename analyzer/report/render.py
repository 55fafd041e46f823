"""Render a report record (and its figures) into one self-contained HTML file.

The page holds everything inline: SVG figures, CSS, a small script (sortable table, copy button)
and the record itself as JSON in ``<script type="application/json" id="perfsweep-data">``.
Nothing is fetched: a Content-Security-Policy forbids every network request, and only the page's
own script (allowed by its SHA-256 hash) may run, so even a string that slipped past escaping
could not execute.

Escaping: jinja2 autoescape for every value in the template; the embedded JSON has ``<``, ``>``
and ``&`` written as ``\\u003c``/``\\u003e``/``\\u0026`` (still valid JSON, and no ``</script>`` or
``<!--`` can appear inside the element).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from analyzer.config.pipeline import knob_cells, knobs_from_dict
from analyzer.measure.gain import LOW_SAMPLE_P99
from analyzer.report.record import ReportRecord
from analyzer.report.svg import Figure

#: The page's only script: sortable tables and copy buttons (see templates/report.js).
_SCRIPT_NAME = "report.js"
_STYLE_NAME = "report.css"


def embed_json(data: Any) -> Markup:
    """JSON safe to place inside a ``<script type="application/json">`` element."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    # U+2028/2029 are valid in JSON but end lines in some JavaScript parsers.
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return Markup(text)


def _template_text(name: str) -> str:
    return resources.files("analyzer.report").joinpath("templates", name).read_text("utf-8")


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: _template_text(name)),
        autoescape=True,  # every value is escaped unless a figure's SVG is marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    env.filters["knob_cells"] = _knob_cells
    return env


def _knob_cells(config: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """A record's ``config`` as its four table cells (a pipeline's stages joined by ``/``)."""
    return knob_cells(knobs_from_dict(config))


def _num(value: Any, digits: int = 1) -> str:
    """A number for a table cell (``-`` for missing)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{100.0 * float(value):.{digits}f} %"


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'"
    )


def render_page(
    template: str,
    data: Mapping[str, Any],
    figures: Mapping[str, Figure | None],
    context: Mapping[str, Any],
) -> str:
    """Render ``template`` with the record's data, its figures and extra context.

    Args:
        template: Template file name under ``analyzer/report/templates``.
        data: The JSON-ready record (embedded as ``perfsweep-data`` and passed as ``r``).
        figures: Figure name -> figure (None: not recorded).
        context: Further template variables.

    Returns:
        The HTML page.
    """
    script = _template_text(_SCRIPT_NAME)
    page = _environment().get_template(template)
    svgs = {
        name: (Markup(fig.svg), fig.alt) if fig is not None else None
        for name, fig in figures.items()
    }
    return page.render(
        r=data,
        figures=svgs,
        data_json=embed_json(data),
        script=Markup(script),
        style=Markup(_template_text(_STYLE_NAME)),
        csp=_csp(script),
        **context,
    )


def diff_lines(diff: str | None) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) pairs for colouring."""
    out = []
    for line in (diff or "").splitlines():
        if line.startswith(("+++", "---")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out


def render_report(record: ReportRecord) -> str:
    """The single-run report page of ``record``."""
    from analyzer.report.figures import report_figures

    data = record.to_dict()
    return render_page(
        "report.html.j2",
        data,
        report_figures(record),
        {
            "diff_lines": diff_lines(record.configs.diff),
            # Trial number -> its predicted capacity (the trials table's "predicted" column).
            "predicted": {
                p.trial_number: p.predicted_rps
                for p in (record.prediction.points if record.prediction else ())
            },
            "version": _version(),
            "low_sample_p99": LOW_SAMPLE_P99,
        },
    )


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("perfsweep")
    except metadata.PackageNotFoundError:
        return "unknown"
