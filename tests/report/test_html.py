"""The HTML as data: it parses, embeds the record, fetches nothing, and escapes run strings."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from analyzer.report import build_record, load_run, write_compare_report, write_report
from analyzer.report.compare import build_comparison
from analyzer.report.render import embed_json
from tests.report.conftest import HOSTILE
from tests.support.cli import perfsweep_in_process

FIGURES = (
    "throughput_vs_p99",
    "best_so_far",
    "importance",
    "slices",
    "latency_breakdown",
    "batch_sizes",
    "load_curves",
    "time_series",
)


class PageParser(HTMLParser):
    """Collects tags, attributes, script bodies and text by element id."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text_by_id: dict[str, str] = {}
        self._script: dict[str, str | None] | None = None
        self._script_text: list[str] = []
        self._open_ids: list[tuple[str, str | None]] = []
        self._texts: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "script":
            self._script, self._script_text = a, []
        self._open_ids.append((tag, a.get("id")))
        if a.get("id"):
            self._texts[a["id"]] = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._script_text)))
            self._script = None
        while self._open_ids:
            open_tag, ident = self._open_ids.pop()
            if ident:
                self.text_by_id[ident] = "".join(self._texts[ident])
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script_text.append(data)
        for _, ident in self._open_ids:
            if ident:
                self._texts[ident].append(data)


def parse(path: Path) -> tuple[str, PageParser]:
    text = path.read_text(encoding="utf-8")
    parser = PageParser()
    parser.feed(text)
    parser.close()
    return text, parser


def embedded(parser: PageParser) -> dict:
    data = [body for attrs, body in parser.scripts if attrs.get("id") == "perfsweep-data"]
    assert len(data) == 1
    assert [a.get("type") for a, _ in parser.scripts if a.get("id") == "perfsweep-data"] == [
        "application/json"
    ]
    return json.loads(data[0])


def assert_no_external_urls(parser: PageParser) -> None:
    for tag, attrs in parser.tags:
        for name in ("src", "href", "xlink:href", "action", "srcset", "poster"):
            value = attrs.get(name)
            if value is None:
                continue
            assert value.startswith(("#", "data:")), f"<{tag} {name}={value!r}> leaves the page"
        assert tag not in ("link", "iframe", "object", "embed", "base"), f"<{tag}> in the report"


@pytest.fixture(scope="module")
def page(planted_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html") / "report.html"
    write_report(planted_run, out)
    return out


def test_page_embeds_the_record(planted_run: Path, page: Path) -> None:
    _, parser = parse(page)
    data = embedded(parser)
    expected = json.loads(json.dumps(build_record(load_run(planted_run)).to_dict()))
    assert data == expected
    assert (
        data["verdict"]["best"]["trial_number"]
        == json.loads((planted_run / "summary.json").read_text())["best"]["trial_number"]
    )


def test_page_has_all_eight_parts(page: Path) -> None:
    text, parser = parse(page)
    ids = {a.get("id") for _, a in parser.tags}
    for section in (
        "verdict",
        "tradeoff",
        "progress",
        "why",
        "curves",
        "stability",
        "config",
        "trials",
    ):
        assert section in ids
    shown = {a.get("data-figure") for tag, a in parser.tags if tag == "figure"}
    assert shown == set(FIGURES)
    svgs = [a for tag, a in parser.tags if tag == "svg"]
    assert len(svgs) == len(FIGURES)
    # Every trial is a row of the sortable table.
    data = embedded(parser)
    rows = re.findall(r"<tr class=\"[^\"]*\">\s*<td data-v=", text)
    assert len(rows) == len(data["trials"])
    assert parser.text_by_id["best-config"] == data["configs"]["best"]
    assert "goals met" in parser.text_by_id["goals-badge"]
    # The validation check at the winner's capacity is a column of the validation table.
    winner = data["validation"][0]
    assert winner["check_rps"] is not None
    verdict = "served" if winner["check_met"] else "missed"
    assert f"{verdict} {winner['check_rps']:.1f} req/s" in parser.text_by_id["validation-table"]
    assert "winner's capacity" in parser.text_by_id["validation-check-note"]
    # What the gain is a ratio of comes from the objective (throughput here).
    assert data["verdict"]["gain_label"] == "best / baseline throughput"
    assert '<div class="muted">best / baseline throughput</div>' in text


def test_page_fetches_nothing(page: Path) -> None:
    _, parser = parse(page)
    assert_no_external_urls(parser)
    csp = [
        a["content"] for tag, a in parser.tags if a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert len(csp) == 1 and "default-src 'none'" in csp[0]


def test_csp_allows_exactly_the_page_script(page: Path) -> None:
    _, parser = parse(page)
    csp = next(
        a["content"] for _, a in parser.tags if a.get("http-equiv") == "Content-Security-Policy"
    )
    code = [body for attrs, body in parser.scripts if "type" not in attrs]
    assert len(code) == 1
    digest = base64.b64encode(hashlib.sha256(code[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp


def test_svg_ids_do_not_collide(page: Path) -> None:
    _, parser = parse(page)
    ids = [a["id"] for _, a in parser.tags if a.get("id")]
    assert len(ids) == len(set(ids))


def test_hostile_model_name_is_escaped(hostile_run: Path, tmp_path: Path) -> None:
    out = write_report(hostile_run, tmp_path / "report.html")
    text, parser = parse(out)
    assert HOSTILE not in text
    assert "alert(1)</script>" not in text
    # Exactly two script elements: the JSON data and the page's own code.
    assert len(parser.scripts) == 2
    assert parser.text_by_id["model-name"] == HOSTILE
    data = embedded(parser)
    assert data["verdict"]["model"] == HOSTILE
    failures = [t["failure"] for t in data["trials"] if t["failure"]]
    assert failures and all(HOSTILE in f for f in failures)  # server strings carry the name too
    assert_no_external_urls(parser)


def test_embed_json_cannot_close_the_element() -> None:
    value = {"s": "</script><script>alert(1)</script><!--", "amp": "a&b", "ls": "\u2028"}
    text = str(embed_json(value))
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == value


def test_compare_calls_out_differences(
    planted_run: Path, hostile_run: Path, tmp_path: Path
) -> None:
    a = build_record(load_run(planted_run, importances=False))
    b = build_record(load_run(hostile_run, importances=False))
    c = build_comparison(a, b)
    served = c.rows[0]
    assert served.a == pytest.approx(a.verdict.best.throughput_rps)
    assert served.b == pytest.approx(b.verdict.best.throughput_rps)
    assert c.rows[1].a == pytest.approx(a.verdict.best.validated_throughput_rps)
    assert served.change == pytest.approx((served.a - served.b) / served.b, abs=1e-4)
    text = " ".join(c.differences)
    assert "Model differs" in text
    assert "Goals differ" in text and "min_throughput_rps" in text
    out = write_compare_report(planted_run, hostile_run, tmp_path / "compare.html")
    html_text, parser = parse(out)
    assert HOSTILE not in html_text
    data = embedded(parser)
    assert data["comparison"]["differences"] == list(c.differences)
    assert data["a"]["verdict"]["model"] == "planted" and data["b"]["verdict"]["model"] == HOSTILE
    assert {a.get("data-figure") for tag, a in parser.tags if tag == "figure"} == {
        "compare_tradeoff",
        "compare_curves",
    }
    assert_no_external_urls(parser)


def test_cli_renders_and_refuses_bad_input(
    planted_run: Path,
    hostile_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In the test process: report reads run directories and writes a page, nothing else (the
    # console script itself runs as a subprocess in tests/load).
    out = tmp_path / "cli.html"
    done = perfsweep_in_process(
        monkeypatch, capsys, "report", str(planted_run), "--output", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout.replace("\n", "")
    assert embedded(parse(out)[1])["provenance"]["run_id"] == planted_run.name
    compare = tmp_path / "cmp.html"
    done = perfsweep_in_process(
        monkeypatch, capsys, "report", str(planted_run), "--compare", str(hostile_run),
        "-o", str(compare),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert embedded(parse(compare)[1])["comparison"]["b"]["model"] == HOSTILE
    done = perfsweep_in_process(monkeypatch, capsys, "report", str(tmp_path / "no-such-run"))
    assert done.returncode == 2
    assert "not a directory" in done.stderr


@pytest.mark.usefixtures("serves")
def test_run_where_every_trial_failed_still_renders(tmp_path: Path) -> None:
    from tests.report.conftest import sweep_run_dir

    # Load 1 is the baseline; every later config load (and its retry) fails.
    # Two trials: a third target failure in a row would abort the sweep (no summary at all).
    sweep_run_dir(tmp_path / "run", trials=2, fail_loads=set(range(2, 50)))
    out = write_report(tmp_path / "run", tmp_path / "report.html")
    _, parser = parse(out)
    data = embedded(parser)
    # The baseline met the goals: it is the answer, and the page says to keep it rather than
    # "nothing works".
    assert data["verdict"]["best"]["trial_number"] == -1
    assert all(t["state"] == "failed" for t in data["trials"] if t["number"] >= 0)
    assert any("2 trial(s) failed" in w for w in data["verdict"]["warnings"])
    assert data["verdict"]["baseline"]["meets_goals"]
    assert data["verdict"]["headline"].startswith("No searched config met the goals")
    assert "keep the model's own config" in data["verdict"]["headline"]
    assert parser.text_by_id["goals-badge"] == "goals met"
    assert_no_external_urls(parser)
