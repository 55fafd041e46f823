"""``make docs-figures``: the docs' example runs, screenshot and quoted output, from one current
demo run, so none of them can describe an older perfsweep.

It runs, in order (a few minutes on a 2-core machine):

1. ``docs/examples/sim-before``: the demo with one instance only
   (``docs/examples/one-instance.toml``: the bundled ``scenarios/resnet50.sim.toml`` with
   ``[space] instance_count = [1, 1]``);
2. ``docs/examples/sim-after``: the demo as bundled (``perfsweep run --model resnet50 --device
   sim``), with ``compare-sim-before.html`` (``perfsweep report --compare``);
3. ``docs/report.png``: the top of ``sim-after/report.html`` in headless Chromium (left as it
   is, with a note, where ``/usr/bin/chromium`` or playwright is missing);
4. every block of the README or a page between ``<!-- figures: NAME -->`` and
   ``<!-- /figures: NAME -->``: the commands of :data:`BLOCKS` and what they printed (the demo
   run's own console for ``run``, ``readme`` and ``gain``).

The old example runs are kept aside until the new ones are written; a failed run puts them back.
The demo run's console is kept as ``sim-after/console.txt``: ``python docs/figures.py
--keep-runs`` quotes the runs there again without running them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples"
BEFORE, AFTER = EXAMPLES / "sim-before", EXAMPLES / "sim-after"
PERFSWEEP = [sys.executable, "-c", "from analyzer.cli import main; main()"]
#: Console width of the quoted output (rich wraps at the terminal's width).
COLUMNS = "200"
CHROMIUM = Path("/usr/bin/chromium")
#: The before run's scenario: the bundled demo's with one instance at most.
ONE_INSTANCE = "one-instance.toml"
#: The demo run's console, kept in its run directory (``--keep-runs`` quotes it again).
CONSOLE = "console.txt"

RUN = "perfsweep run --model resnet50 --device sim --run-dir docs/examples/sim-after"
PREDICT = (
    "perfsweep predict docs/examples/sim-after --p99-ms 60 --max-batch-size 8 "
    "--preferred-batch-size 8 --max-queue-delay-us 1000 --instance-count 2"
)
COMPARE = "perfsweep report docs/examples/sim-after --compare docs/examples/sim-before"
#: The capacity line of ``perfsweep predict``.
CAPACITY = r"^predicted capacity"
#: Block name -> ``(command shown, command run, lines kept)``: None keeps every line, a pattern
#: the lines it finds (an elision marks what is left out). ``run`` is the demo run's console.
BLOCKS: dict[str, list[tuple[str | None, str, str | None]]] = {
    "run": [(f"{RUN} | cat", RUN, None)],
    "readme": [
        (
            "perfsweep run --model resnet50 --device sim",
            RUN,
            r"^\[.*\] (baseline: \d|trial \d)|^gain over baseline|^trials:|^best config:|^report:",
        )
    ],
    # The demo run's gain sentence, as the console wraps it.
    "gain": [(None, RUN, r"^gain over baseline|^measurement's resolution only")],
    # The comparison page's differences (the command prints only where it wrote the page).
    "compare": [(None, COMPARE, None)],
    "predict": [(PREDICT, PREDICT, r"^(config:|predicted capacity)")],
    "shapes": [
        (PREDICT, PREDICT, CAPACITY),
        (
            "perfsweep predict ... --arrival mmpp:3@2,0.5@4",
            f"{PREDICT} --arrival mmpp:3@2,0.5@4",
            CAPACITY,
        ),
        (
            "perfsweep predict ... --trace examples/traces/bursty-minute.csv",
            f"{PREDICT} --trace examples/traces/bursty-minute.csv",
            CAPACITY,
        ),
    ],
}


def kept(output: str, keep: str | None, last: bool) -> str:
    """The lines of ``output`` a block quotes: those ``keep`` finds, ``...`` after them where
    lines were left out of the last command's output."""
    if keep is None:
        return output
    lines = output.splitlines()
    chosen = [line for line in lines if re.search(keep, line)]
    return "\n".join(chosen + (["..."] if last and len(chosen) < len(lines) else []))


def perfsweep(command: str) -> str:
    """Run a ``perfsweep ...`` line of :data:`BLOCKS` from the repository root: its output
    (stdout and stderr, as a reader's terminal shows them, piped)."""
    words = command.removesuffix(" | cat").split()[1:]
    env = {**os.environ, "COLUMNS": COLUMNS, "NO_COLOR": "1"}
    done = subprocess.run(
        [*PERFSWEEP, *words],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # in the order a terminal shows them
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"{command} failed ({done.returncode}):\n{done.stdout}")
    return "\n".join(line.rstrip() for line in done.stdout.rstrip().splitlines())


def demo_runs() -> str:
    """Write both example runs (the old ones restored if either fails); the second's console."""
    with tempfile.TemporaryDirectory(prefix="perfsweep-figures-") as tmp:
        kept = Path(tmp) / "kept"
        kept.mkdir()
        for run in (BEFORE, AFTER):
            if run.exists():
                shutil.move(str(run), str(kept / run.name))
        try:
            # Written beside the runs, so the before run's recorded command can be run again.
            bundled = (REPO / "scenarios" / "resnet50.sim.toml").read_text(encoding="utf-8")
            (EXAMPLES / ONE_INSTANCE).write_text(
                re.sub(r"(?m)^instance_count = .*$", "instance_count = [1, 1]", bundled),
                encoding="utf-8",
            )
            perfsweep(
                f"perfsweep run --scenario docs/examples/{ONE_INSTANCE} "
                "--run-dir docs/examples/sim-before"
            )
            console = perfsweep(RUN)
            (AFTER / CONSOLE).write_text(console + "\n", encoding="utf-8")
            return console
        except BaseException:
            for run in (BEFORE, AFTER):
                shutil.rmtree(run, ignore_errors=True)
                if (kept / run.name).exists():
                    shutil.move(str(kept / run.name), str(run))
            raise


def differences(page: Path) -> str:
    """The differences a comparison page states first, one ``- `` line each (from the data the
    page embeds)."""
    html = page.read_text(encoding="utf-8")
    found = re.search(
        r'<script type="application/json" id="perfsweep-data">(.*?)</script>', html, re.S
    )
    if found is None:
        raise SystemExit(f"{page}: no embedded data")
    return "\n".join(
        f"- {line}" for line in json.loads(found.group(1))["comparison"]["differences"]
    )


def screenshot(report: Path, png: Path) -> str:
    """The top of ``report`` as ``png`` (1100 px wide, as the page shows it)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return f"{png.name} left as it is: playwright is not installed"
    if not CHROMIUM.exists():
        return f"{png.name} left as it is: {CHROMIUM} is missing (apt-get install chromium)"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1100, "height": 1250})
        page.goto(report.resolve().as_uri())
        page.screenshot(path=str(png))
        browser.close()
    return f"{png.name} written"


def quote(name: str, outputs: list[str]) -> str:
    """Block ``name`` as a page shows it: each command after ``$``, then its kept lines."""
    lines = []
    entries = BLOCKS[name]
    for i, ((shown, _, keep), output) in enumerate(zip(entries, outputs, strict=True)):
        lines += [f"$ {shown}"] if shown else []
        lines.append(kept(output, keep, i == len(entries) - 1))
    return "```\n" + "\n".join(lines) + "\n```"


def fill_pages(outputs: dict[str, list[str]]) -> list[str]:
    """Rewrite every marked block of every page; the pages changed."""
    changed = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")

        named = set(re.findall(r"<!-- figures: (\S+) -->", text))
        if named - set(outputs):
            raise SystemExit(f"{page}: no figures block named {sorted(named - set(outputs))}")
        new = re.sub(
            r"<!-- figures: (\S+) -->\n.*?\n<!-- /figures: \1 -->",
            lambda m: (
                f"<!-- figures: {m.group(1)} -->\n{quote(m.group(1), outputs[m.group(1)])}\n"
                f"<!-- /figures: {m.group(1)} -->"
            ),
            text,
            flags=re.DOTALL,
        )
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(str(page.relative_to(REPO)))
    return changed


def main() -> None:
    if "--keep-runs" in sys.argv[1:]:  # the pages and screenshot again, from the runs there
        console = (AFTER / CONSOLE).read_text(encoding="utf-8").rstrip()
    else:
        console = demo_runs()
    outputs = {"run": [console], "readme": [console], "gain": [console]}
    perfsweep(COMPARE)
    outputs["compare"] = [differences(AFTER / "compare-sim-before.html")]
    for name in ("predict", "shapes"):
        outputs[name] = [perfsweep(run) for _, run, _ in BLOCKS[name]]
    print(screenshot(AFTER / "report.html", REPO / "docs" / "report.png"))
    for page in fill_pages(outputs):
        print(f"{page} rewritten")


if __name__ == "__main__":
    main()
