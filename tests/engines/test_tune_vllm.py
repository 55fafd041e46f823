"""``perfsweep run --serve-command`` on vLLM's CPU build: engine settings tuned through restarts.

vLLM takes ``--max-num-seqs`` and ``--max-num-batched-tokens`` on its command line, so each
config is a restart of the server from the user's template (``{port}``, ``{max_num_seqs}``,
``{max_num_batched_tokens}``). A start takes 15-60 s here, so the search is as sparing as a
search can be: the engine's own settings (the baseline) and one config of the space, two
starts. What only the real engine shows: the server perfsweep started for the trial runs the
trial's settings (vLLM logs its engine arguments), and the answer's command line, written to
``best/command.txt``, is one perfsweep started and measured: the recommended configuration's.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from analyzer.rundir.results import RunDirectory, load_summary
from tests.support.llm_model import MODEL_NAME, VllmInstall, ensure_model
from tests.support.servers import REPO_ROOT

CLI = [sys.executable, "-c", "from analyzer.cli import main; main()"]

SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
engine = "vllm"
serve_command = {template}
[traffic]
input_tokens = "24"
output_tokens = "12"
min_rate_rps = 0.5
# One level a config where the engine keeps up (the trial's two sequences serve about 3 req/s
# of these streams here): the search is about restarts, not this engine's capacity.
start_rps = 1.5
max_rate_rps = 1.5
[goals]
ttft_p99_ms = 4000.0
itl_p99_ms = 2000.0
[space]
max_num_seqs = [2]
max_num_batched_tokens = [512]
[budget]
trials = 1
warmup_s = 0.5
window_s = 1.0
min_requests = 4
capacity_resolution = 0.5
validate_top = 0
[search]
strategy = "grid"
"""


def test_vllm_is_tuned_through_restarts_and_its_answer_is_a_command_line(
    vllm_install: VllmInstall, live_sweep: None, tmp_path: Path
) -> None:
    model = ensure_model(vllm_install)
    # As a user writes it: the environment vLLM's CPU build wants, then the server and its flags
    # (--enforce-eager: no torch.compile warm-up, half a minute less a start).
    fixed = [
        "env",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "HF_HUB_OFFLINE=1",
        "VLLM_NO_USAGE_STATS=1",
        str(vllm_install.python),
        *("-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--served-model-name", MODEL_NAME, "--host", "127.0.0.1"),
        *("--dtype", "float32", "--max-model-len", "512", "--enforce-eager"),
    ]
    template = (
        shlex.join(fixed) + " --port {port} --max-num-seqs {max_num_seqs}"
        " --max-num-batched-tokens {max_num_batched_tokens}"
    )
    scenario = tmp_path / "vllm.toml"
    scenario.write_text(SCENARIO.format(model=MODEL_NAME, template=json.dumps(template)))
    done = subprocess.run(
        [*CLI, "run", "--scenario", str(scenario), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "run"
    summary = load_summary(run_dir)
    target = summary["environment"]["target"]
    assert target["kind"] == "command" and target["starts"] == 2, target
    log = Path(target["log"]).read_text(errors="replace")
    # vLLM's own account of its engine arguments, once per start: the defaults, then the trial's.
    assert _engine_arg(log, "max_num_seqs") == [256, 2]  # vLLM's default, then the trial's
    assert _engine_arg(log, "max_num_batched_tokens") == [2048, 512]
    (trial,) = [r for r in RunDirectory(run_dir).load_existing_trials() if r.number >= 0]
    assert trial.config.max_num_seqs == 2 and trial.config.max_num_batched_tokens == 512
    figures = trial.token_figures()
    assert figures["ttft_p99_ms"] and figures["output_tokens_per_s"], figures
    assert trial.throughput_rps > 0
    # The answer is a command line that ran: the one perfsweep started for the configuration
    # recommended (the trial's, or the engine's own settings), on the run's port.
    command = (run_dir / "best" / "command.txt").read_text().strip()
    recommended = summary["recommendation"]["config"]
    words = shlex.split(command)
    assert words[: len(fixed)] == fixed
    assert words[words.index("--port") + 1] == target["url"].rsplit(":", 1)[1]
    seqs = "2" if recommended == "best" else "256"  # else the engine's own settings
    assert words[words.index("--max-num-seqs") + 1] == seqs, (recommended, command)
    assert f"--- perfsweep: starting {' '.join(words)}" in log  # the line that started
    measured = json.loads((run_dir / "best" / "measured.json").read_text())
    assert measured["output_tokens_per_s"] > 0


def _engine_arg(log: str, name: str) -> list[int]:
    """The values vLLM's start-up line (``non-default args: {... 'max_num_seqs': 2 ...}``) gives
    an engine argument, one per start, in order."""
    return [int(v) for v in re.findall(rf"'{name}': (\d+)", log)]
