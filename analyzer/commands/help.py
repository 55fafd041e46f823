"""What every command's help shares: its panels, the choices flags take, defaults a scenario
sets, and the examples and exit codes at its end.

A flag that only overrides the scenario has no default of its own (None: not given); its help
shows the default a scenario starts from and the key that changes it (:func:`from_scenario`).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from rich.markup import escape

from analyzer.config.scenario import Scenario

__all__ = [
    "DATA",
    "DISTRIBUTED",
    "GOALS",
    "MEASUREMENT",
    "OUTPUT",
    "SEARCH",
    "SECURED",
    "SERVER",
    "TRAFFIC",
    "Choice",
    "Device",
    "Engine",
    "Leave",
    "LoadProtocol",
    "ObjectiveName",
    "RateLimit",
    "SearchStrategy",
    "ServerKind",
    "SharedMemory",
    "TraceUnit",
    "epilog",
    "from_scenario",
    "value",
]

# ---- panels: the option groups of each command's help, in the order a reader needs them ----
SERVER = "Model and server"
GOALS = "Goals"
TRAFFIC = "Traffic"
DATA = "Request data"
SEARCH = "Search and budget"
MEASUREMENT = "Measurement"
OUTPUT = "Output"
DISTRIBUTED = "Distributed load"
SECURED = "Secured server"


# ---- choices (the scenario's own values; tests/unit/test_cli_names.py checks they match) ----
class Choice(str, Enum):
    """A flag's value among a few names; prints as its name."""

    def __str__(self) -> str:
        return str(self.value)


class Device(Choice):
    """``[model] device``."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    sim = "sim"


class Engine(Choice):
    """``[model] engine``: the generative engine behind ``--serve-command``."""

    vllm = "vllm"
    tensorrtllm = "tensorrtllm"
    sglang = "sglang"


class LoadProtocol(Choice):
    """``--protocol`` (``[model] protocol``): http, grpc, and the streaming protocols of
    generative models (``analyzer.config.sections.STREAM_PROTOCOLS``)."""

    http = "http"
    grpc = "grpc"
    grpc_stream = "grpc-stream"
    generate_stream = "generate-stream"
    openai = "openai"
    openai_chat = "openai-chat"


class ServerKind(Choice):
    """``[model] server``."""

    reference = "reference"
    triton = "triton"
    virtual = "virtual"


class ObjectiveName(Choice):
    """``objective``."""

    throughput = "throughput"
    latency = "latency"
    pareto = "pareto"


class SearchStrategy(Choice):
    """``[search] strategy``."""

    predict = "predict"
    tpe = "tpe"
    random = "random"
    grid = "grid"


class RaggedBatch(Choice):
    """``[space] ragged_batch``."""

    on = "on"
    off = "off"
    search = "search"


class Leave(Choice):
    """``[run] leave``."""

    original = "original"
    best = "best"


class TraceUnit(Choice):
    """``[traffic] trace_unit``."""

    auto = "auto"
    s = "s"
    ms = "ms"
    us = "us"


class SharedMemory(Choice):
    """``[input] shared_memory``."""

    none = "none"
    system = "system"


class RateLimit(Choice):
    """``perfsweep serve --rate-limit`` (tritonserver's values)."""

    off = "off"
    execution_count = "execution_count"


def value(choice: Enum | None) -> Any:
    """The value of a choice flag (None: not given)."""
    return None if choice is None else choice.value


_DEFAULTS = Scenario()


def from_scenario(key: str) -> str:
    """A flag's default as help shows it: the default of scenario key ``key`` (``budget.trials``)
    and that a scenario file sets it."""
    node: Any = _DEFAULTS
    for part in key.split("."):
        node = getattr(node, part)
    shown = "none" if node is None else f"{node:g}" if isinstance(node, float) else str(node)
    return f"{shown}, or the scenario's {key}"


def epilog(examples: list[tuple[str, str]], exit_codes: str) -> str:
    """The end of a command's help: command lines that work, each after what it does, then the
    exit codes (rich markup escaped: a ``[`` prints as written)."""
    lines = ["Examples:"]
    for line, what in examples:
        lines += ["", f"  # {escape(what)}", f"  {escape(line)}"]
    return "\n".join([*lines, "", escape(exit_codes)])
