"""The scenario: one typed, frozen, validated description of a sweep.

This module holds :class:`Scenario`, how it is loaded (file, environment, flags) and hashed; its
sections (``[model]``, ``[goals]``...) are the models of :mod:`analyzer.config.sections`.

A scenario is built once, at the edge, from three layers (later wins)::

    scenario file (scenarios/*.toml)  <  PERFSWEEP_* environment variables  <  CLI flags

Every layer speaks the same dotted keys (``goals.p99_ms``, ``budget.trials``...). Environment
variables spell them ``PERFSWEEP_<SECTION>_<KEY>`` (``PERFSWEEP_GOALS_P99_MS=50``). Unknown keys are
errors that name the key, so a typo never silently falls back to a default.

Example (``scenarios/resnet50.toml`` is the default for ``--model resnet50``)::

    objective = "throughput"
    [model]
    name = "resnet50"
    [goals]
    p99_ms = 200
    [space]
    max_batch_size = [1, 16]
    instance_count = [1, 2]
    [budget]
    trials = 12
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, field_validator, model_validator

from analyzer.config.access import collect_headers
from analyzer.config.objective import OBJECTIVES, Objective, objective_for
from analyzer.config.sections import (
    BudgetSection,
    GateSection,
    GoalsSection,
    InputSection,
    ModelSection,
    RunSection,
    SearchSection,
    Section,
    SpaceSection,
)
from analyzer.config.traffic import TrafficSection
from analyzer.config.urls import http_url  # the one place URLs are checked
from analyzer.errors import InputError, ScenarioError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Where bundled scenario files live (the repository's ``scenarios/`` directory).
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"

_ENV_PREFIX = "PERFSWEEP_"
#: Top-level keys that are read as other keys (``[[models]]``: ``[[traffic.classes]]``).
_READ_AS = ("models",)


def _model_of_mix(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with ``model.name`` the first model of its mix when it names none and every
    traffic class names its model (a mix of models: the load's own model is one of them)."""
    classes = (data.get("traffic") or {}).get("classes") or []
    model = dict(data.get("model") or {})
    named = [c.get("model") for c in classes if isinstance(c, Mapping)]
    if "name" in model or not named or not all(named):
        return data
    return {**data, "model": {**model, "name": named[0]}}


class Scenario(Section):
    """One sweep, fully described. Build it with :func:`load_scenario`."""

    objective: str = "throughput"
    """``throughput``: the highest load served within the goals (capacity search per config);
    ``latency``: the lowest p99 at ``traffic.rate_rps``; ``pareto``: throughput vs p99 front.
    One of :data:`analyzer.config.objective.OBJECTIVES`."""
    model: ModelSection = ModelSection()
    input: InputSection = InputSection()
    traffic: TrafficSection = TrafficSection()
    goals: GoalsSection = GoalsSection()
    space: SpaceSection = SpaceSection()
    budget: BudgetSection = BudgetSection()
    search: SearchSection = SearchSection()
    run: RunSection = RunSection()
    gate: GateSection = GateSection()

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, name: str) -> str:
        if name not in OBJECTIVES:
            try:
                objective_for(name)
            except InputError as exc:  # names the valid ones
                raise ValueError(str(exc)) from exc
        return name

    @model_validator(mode="before")
    @classmethod
    def _models_as_classes(cls, data: Any) -> Any:
        """``[[models]]`` (several models served together, each with its share of the requests
        and its own p99 goal) is read as ``[[traffic.classes]]``, one class per model named
        after it; the shares are relative weights, made to sum to 1. ``model.name`` defaults
        to the first model (the load's own; the others are routed by class)."""
        if not isinstance(data, Mapping):
            return data
        if "models" not in data:
            return _model_of_mix(data)
        data = dict(data)
        entries = data.pop("models")
        traffic = dict(data.get("traffic") or {})
        if traffic.get("classes"):
            raise ValueError(
                "[[models]] and [[traffic.classes]] both given: a mix of models is one class "
                "per model; give one of them"
            )
        if not isinstance(entries, list) or len(entries) < 2:
            raise ValueError("[[models]] names the models served together: two or more")
        allowed = {"name", "share", "rate_rps", "p99_ms"}
        for entry in entries:
            if not isinstance(entry, Mapping) or not entry.get("name"):
                raise ValueError("each [[models]] entry needs a name")
            if extra := sorted(set(entry) - allowed):
                raise ValueError(
                    f"[[models]] {entry['name']!r}: unknown key(s) {', '.join(extra)} "
                    f"(known: {', '.join(sorted(allowed))})"
                )
            if "share" in entry and "rate_rps" in entry:
                raise ValueError(
                    f"[[models]] {entry['name']!r}: a share of the load or a rate of its own "
                    "(rate_rps), not both"
                )
        weights = {
            entry["name"]: entry.get("share", 1.0) for entry in entries if "rate_rps" not in entry
        }
        if not all(isinstance(w, int | float) and w > 0 for w in weights.values()):
            raise ValueError(
                f"[[models]] shares must be positive numbers, got {list(weights.values())}"
            )
        rates = {entry["name"]: entry["rate_rps"] for entry in entries if "rate_rps" in entry}
        traffic["classes"] = mix_classes(
            weights, rates, {entry["name"]: entry.get("p99_ms", 0.0) for entry in entries}
        )
        if rates and "min_rate_rps" not in traffic:
            traffic["min_rate_rps"] = lowest_mix_rate(rates)
        data["traffic"] = traffic
        return _model_of_mix(data)

    def mix(self) -> tuple[str, ...]:
        """The models served together (``model.name`` first), or empty: one model."""
        names = [self.model.name, *(c.model or self.model.name for c in self.traffic.classes)]
        models = tuple(dict.fromkeys(names))
        return models if len(models) > 1 else ()

    def mix_shares_goals(self) -> tuple[tuple[str, float, float, float], ...]:
        """``(model, share, p99 goal ms, own rate req/s)`` of each model of a mix, in
        :meth:`mix`'s order: its classes' shares and own rates summed, the strictest of their
        goals (a class without one: the run's ``goals.p99_ms``); empty for one model."""
        out = []
        for name in self.mix():
            classes = [c for c in self.traffic.classes if (c.model or self.model.name) == name]
            share = sum(c.share for c in classes)
            rate = sum(c.rate_rps for c in classes)
            goal = min((c.p99_ms or self.goals.p99_ms for c in classes), default=self.goals.p99_ms)
            out.append((name, share, goal, rate))
        return tuple(out)

    def objective_spec(self) -> Objective:
        """The :class:`~analyzer.config.objective.Objective` that ``objective`` names."""
        return objective_for(self.objective)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> Scenario:
        start = self.traffic.start_rps
        if (
            start is not None
            and not self.traffic.min_rate_rps <= start <= self.traffic.max_rate_rps
        ):
            raise ValueError(
                f"traffic.start_rps ({start}) must lie within traffic.min_rate_rps "
                f"({self.traffic.min_rate_rps}) and traffic.max_rate_rps ({self.traffic.max_rate_rps})"
            )
        if self.traffic.min_rate_rps > self.traffic.max_rate_rps:
            raise ValueError(
                f"traffic.min_rate_rps ({self.traffic.min_rate_rps}) is above "
                f"traffic.max_rate_rps ({self.traffic.max_rate_rps})"
            )
        problem = self.objective_spec().traffic_problem(self.traffic)
        if problem:
            raise ValueError(problem)
        m = self.model
        if m.url is None and (m.ssl_ca or m.ssl_cert or m.ssl_key or m.ssl_insecure):
            raise ValueError(
                "model.ssl_* (--ssl-ca, --ssl-cert, --ssl-key, --ssl-insecure) reach a secured "
                "server at model.url (--url); a managed server speaks plain HTTP and gRPC"
            )
        if m.url is not None:
            if not m.url.lower().startswith(("http://", "https://")):
                raise ValueError(f"model.url must start with http:// or https://, got {m.url!r}")
            try:
                http_url(m.url)
            except InputError as exc:
                raise ValueError(f"model.url: {exc}") from exc
        if self.run.storage is not None and self.run.study_name is None:
            raise ValueError("run.storage needs run.study_name (workers find the study by name)")
        served = {c.model or self.model.name for c in self.traffic.classes}
        if len(served) > 1 and self.model.name not in served:
            raise ValueError(
                f"model.name {self.model.name!r} gets none of the mix's requests (its models: "
                f"{', '.join(sorted(served))}): name one of them (--model), or leave it out"
            )
        for name, goal in self.traffic.class_goals():
            if goal > self.goals.p99_ms:
                # The overall p99 is what a sequential step tests against goals.p99_ms: it must
                # be the loosest goal, or it fails levels that every class passes.
                raise ValueError(
                    f"traffic.classes {name!r}: p99_ms {goal:g} is above goals.p99_ms "
                    f"{self.goals.p99_ms:g}; set goals.p99_ms to the loosest class goal"
                )
        return self

    def to_dict(self) -> dict[str, Any]:
        """The scenario as plain JSON-able data (paths as strings, tuples as lists)."""
        return json.loads(self.model_dump_json())

    def to_toml(self) -> str:
        """The scenario as TOML text that :func:`load_scenario` reads back to an equal object."""
        return _to_toml(self.to_dict())

    def tightest_p99_ms(self) -> float:
        """The tightest p99 goal a level is judged on: the run's, or a traffic class's own."""
        return min([self.goals.p99_ms, *(p99 for _, p99 in self.traffic.class_goals())])

    def hash(self) -> str:
        """A short, stable fingerprint of what the scenario measures (recorded with every result).

        The hashed document is :data:`HASH_VERSION` and the scenario's keys that decide what is
        measured, each left out where it equals its default (:func:`_without_defaults`): a key
        added later with a default leaves every existing hash as it was. Keys that do not change
        what is measured (the gate's thresholds, the goals' note, what is left on the server,
        where metrics, the binary and the generator's workers are) are never in it.

        Returns:
            ``v<HASH_VERSION>-`` and 16 hex digits (:func:`hash_version` reads the version back).
        """
        data = _without_defaults(_hashed(self), _hashed(_DEFAULT_SCENARIO))
        data["hash_version"] = HASH_VERSION
        text = json.dumps(data, sort_keys=True)
        return f"v{HASH_VERSION}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


#: Version of :meth:`Scenario.hash`'s document. Bump it when a scenario that measures the same
#: thing would hash differently (a key's default changed, a key moved), or the reverse.
#: Version 1 (no ``v`` prefix) listed the keys it left out one by one, so older scenarios kept
#: their hashes; a version 1 hash and a version 2 hash never match, even for the same scenario.
HASH_VERSION = 2


def hash_version(scenario_hash: str) -> int:
    """The :data:`HASH_VERSION` a recorded scenario hash was made with (1: no ``v`` prefix)."""
    prefix, sep, _ = scenario_hash.partition("-")
    if sep and prefix.startswith("v") and prefix[1:].isdigit():
        return int(prefix[1:])
    return 1


def _hashed(scenario: Scenario) -> dict[str, Any]:
    """The scenario's data as far as it decides what is measured."""
    data = scenario.to_dict()
    data.pop("gate", None)  # gate thresholds do not change what is measured
    data["goals"].pop("note", None)  # nor does the reason given for the goals
    data["run"].pop("leave", None)  # nor does what is left on the server afterwards
    data["run"].pop("server_wait_s", None)  # nor how long a dead server is waited for
    data["run"].pop("report", None)  # nor whether the report is rendered
    data["model"].pop("metrics_url", None)  # nor where the metrics are read
    data["model"].pop("triton_server_path", None)  # nor where the tritonserver binary lies
    for key in ("grpc_url", "ssl_ca", "ssl_cert", "ssl_key", "ssl_insecure"):
        data["model"].pop(key, None)  # nor where the gRPC port and the TLS files are
    for key in ("workers", "expect_workers", "master_bind_host", "master_port"):
        data["traffic"].pop(key, None)  # nor does where the generator runs
    data["input"] = scenario.input.identity()  # a data file by its bytes, not by its path
    data["traffic"].pop("trace", None)  # a trace too (its trace_sha256 stays)
    if data["space"].get("response_cache") in (None, "off"):
        data["model"].pop("cache_size_bytes", None)  # no cache: its size measures nothing
    if not data["budget"].get("sequential", True):
        data["budget"].pop("sequential_max_requests", None)  # fixed windows: nothing to cap
    return data


def _without_defaults(data: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without the keys equal to their value in ``defaults`` (sections recursively;
    a section left empty goes too)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        default = defaults.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(default, dict):
            value = _without_defaults(value, default)
            if value:
                out[key] = value
        elif value != default:
            out[key] = value
    return out


_MISSING = object()
#: What a key left out of a scenario file means (the reference of :func:`_without_defaults`).
_DEFAULT_SCENARIO = Scenario()


def parse_shapes(items: list[str] | None) -> dict[str, list[int]] | None:
    """``["IDS:128", "X:3,4"]`` -> ``{"IDS": [128], "X": [3, 4]}``; None when none given."""
    if not items:
        return None
    out: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.partition(":")
        try:
            if not name or not sep:
                raise ValueError(item)
            out[name] = [int(d) for d in dims.split(",")]
        except ValueError as exc:
            raise InputError(f"--shape takes NAME:D1,D2 (e.g. IDS:128), got {item!r}") from exc
    return out


def input_overrides(
    shape: list[str] | None = None,
    input_data: str | None = None,
    batch_size: int | None = None,
    unique_payloads: int | None = None,
    repeat_ratio: float | None = None,
    shared_memory: str | None = None,
    pad_buckets: str | None = None,
    pad_values: str | None = None,
) -> dict[str, Any]:
    """The request-data flags of ``run``, ``gate`` and ``load`` as dotted ``[input]`` keys for
    :func:`load_scenario` (None: not given). A file given by flag is relative to the working
    directory. ``pad_buckets``: ``auto`` or ``64,128,256``; ``pad_values``: ``IDS=0,MASK=0``."""
    data = data_file = None
    if input_data in ("random", "zeros"):
        data = input_data
    elif input_data is not None:
        data_file = str(Path(input_data).expanduser().resolve())
    return {
        "input.shapes": parse_shapes(shape),
        "input.data": data,
        "input.data_file": data_file,
        "input.batch_size": batch_size,
        "input.unique_payloads": unique_payloads,
        "input.repeat_ratio": repeat_ratio,
        "input.shared_memory": shared_memory,
        "input.pad_buckets": _pad_buckets(pad_buckets),
        "input.pad_values": _pad_values(pad_values),
    }


def _pad_buckets(text: str | None) -> str | list[int] | None:
    """``--pad-buckets auto`` or ``64,128,256``."""
    if text is None or text == "auto":
        return text
    try:
        return [int(b) for b in text.split(",") if b.strip()]
    except ValueError as exc:
        raise InputError(
            f"--pad-buckets takes auto or lengths like 64,128,256, got {text!r}"
        ) from exc


def _pad_values(text: str | None) -> dict[str, float] | None:
    """``--pad-values IDS=0,MASK=0``."""
    if text is None:
        return None
    out: dict[str, float] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, eq, number = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError(item)
            out[name.strip()] = float(number)
        except ValueError as exc:
            raise InputError(
                f"--pad-values takes NAME=VALUE,... (e.g. IDS=0,MASK=0), got {item!r}"
            ) from exc
    return out


def traffic_overrides(
    arrival: str | None = None, trace: str | None = None, trace_unit: str | None = None
) -> dict[str, Any]:
    """The traffic-shape flags of ``run``, ``gate`` and ``load`` (``--arrival``, ``--trace``,
    ``--trace-unit``) as dotted keys for :func:`load_scenario` (None: not given). A trace
    given by flag is relative to the working directory."""
    return {
        "traffic.arrival": "trace" if trace is not None and arrival is None else arrival,
        "traffic.trace": str(Path(trace).expanduser().resolve()) if trace is not None else None,
        "traffic.trace_unit": trace_unit,
    }


def mix_overrides(mix: str | None = None) -> dict[str, Any]:
    """``--mix a=3,b=1@40,c=20/s`` (models, their relative weights or, with ``/s``, a rate of
    their own in req/s, and after ``@`` a model's own p99 goal in ms) as ``[[traffic.classes]]``,
    one class per model named after it, the weights made shares of 1 (None: not given). A model
    without ``@`` is held to the run's p99. With rates of their own, the lowest rate a capacity
    search tries is just above their sum (:func:`lowest_mix_rate`)."""
    if mix is None:
        return {}
    weights: dict[str, float] = {}
    rates: dict[str, float] = {}
    goals: dict[str, float] = {}
    for item in (part.strip() for part in mix.split(",")):
        name, sep, rest = item.partition("=")
        amount, at, goal = rest.partition("@")
        is_rate = amount.endswith("/s")
        value = _positive(amount.removesuffix("/s")) if sep else math.nan
        p99 = _positive(goal) if at else 0.0
        if not name or math.isnan(value) or math.isnan(p99) or name in goals:
            raise InputError(
                f"--mix takes MODEL=WEIGHT pairs (or MODEL=RATE/s, a rate of its own), each "
                f"model once with a positive number and optionally @P99_MS, its own p99 goal "
                f"(e.g. a=3,b=1@40,c=20/s); got {mix!r}"
            )
        (rates if is_rate else weights)[name] = value
        goals[name] = p99
    if len(goals) < 2:
        raise InputError(f"--mix names the models served together: two or more, got {mix!r}")
    if not weights:
        raise InputError(
            f"--mix: every model has a rate of its own; give at least one a weight (the load a "
            f"capacity search scales), got {mix!r}"
        )
    out: dict[str, Any] = {"traffic.classes": mix_classes(weights, rates, goals)}
    if rates:
        out["traffic.min_rate_rps"] = lowest_mix_rate(rates)
    return out


def mix_classes(
    weights: Mapping[str, float], rates: Mapping[str, float], goals: Mapping[str, float]
) -> list[dict[str, Any]]:
    """A mix of models as ``[[traffic.classes]]``, one class per model named after it, in the
    order of ``goals``: a model of ``weights`` gets its weight as a share of 1 (of the load the
    rates leave), a model of ``rates`` its own rate; each its p99 goal (0: the run's)."""
    total = float(sum(weights.values()))
    out = []
    for name, p99 in goals.items():
        amount = {"share": weights[name] / total} if name in weights else {"rate_rps": rates[name]}
        out.append({"name": name, "model": name, **amount, "p99_ms": p99})
    return out


#: With models at rates of their own, the lowest whole-load rate a capacity search tries leaves
#: this fraction of their sum to the models with shares.
MIX_RATE_HEADROOM = 0.05


def lowest_mix_rate(rates: Mapping[str, float]) -> float:
    """The lowest rate of the whole load a capacity search tries when ``rates`` are held: just
    above their sum (``traffic.min_rate_rps`` unless given)."""
    return round(sum(rates.values()) * (1 + MIX_RATE_HEADROOM), 3)


def _positive(text: str) -> float:
    """``text`` as a positive finite number, else NaN."""
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) and value > 0 else math.nan


def generator_overrides(
    protocol: str | None = None,
    metrics_url: str | None = None,
    workers: str | int | None = None,
    expect_workers: int | None = None,
    master_bind_host: str | None = None,
    master_port: int | None = None,
) -> dict[str, Any]:
    """The generator flags of ``run`` and ``gate`` as dotted keys for :func:`load_scenario`
    (None: not given). ``workers`` is a count or ``"auto"``, as ``--workers`` takes it."""
    if isinstance(workers, str) and workers != "auto":
        try:
            workers = int(workers)
        except ValueError:
            raise InputError(f"--workers: {workers!r} is neither a count nor auto") from None
    return {
        "model.protocol": protocol,
        "model.metrics_url": metrics_url,
        "traffic.workers": workers,
        "traffic.expect_workers": expect_workers,
        "traffic.master_bind_host": master_bind_host,
        "traffic.master_port": master_port,
    }


def access_overrides(
    grpc_url: str | None = None,
    ssl_ca: Path | None = None,
    ssl_cert: Path | None = None,
    ssl_key: Path | None = None,
    ssl_insecure: bool = False,
    headers: list[str] | None = None,
    header_files: list[Path] | None = None,
) -> dict[str, Any]:
    """How the server is reached, as dotted keys for :func:`load_scenario` (None: not given).
    Header values are read here (``${VAR}`` from the environment, files): the scenario holds
    them in a field that is never dumped."""
    return {
        "model.grpc_url": grpc_url,
        "model.ssl_ca": str(ssl_ca) if ssl_ca else None,
        "model.ssl_cert": str(ssl_cert) if ssl_cert else None,
        "model.ssl_key": str(ssl_key) if ssl_key else None,
        "model.ssl_insecure": True if ssl_insecure else None,
        "model.headers": collect_headers(headers, header_files),
    }


def bundled_scenario(model: str, device: str | None = None) -> Path | None:
    """The bundled scenario file for ``model`` (and ``device``), or None when there is none.

    ``scenarios/<model>.<device>.toml`` wins over ``scenarios/<model>.toml`` so that a device with
    very different speed (the simulated GPU) gets budgets of its own.
    """
    candidates = []
    if device:
        candidates.append(SCENARIO_DIR / f"{model}.{device}.toml")
    candidates.append(SCENARIO_DIR / f"{model}.toml")
    return next((path for path in candidates if path.is_file()), None)


def load_scenario(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Scenario:
    """Build the scenario from a TOML file, ``PERFSWEEP_*`` variables and flag overrides.

    Args:
        path: A scenario TOML file, or None for the built-in defaults.
        overrides: Dotted keys (``"goals.p99_ms"``) to values, usually from CLI flags. A value
            of None means "not given" and is skipped.
        env: The environment to read ``PERFSWEEP_*`` variables from (``os.environ`` if None).

    Returns:
        The validated, frozen scenario.

    Raises:
        ScenarioError: The file cannot be read, a key is unknown, or a value is invalid. The
            message is one line that names the key.
    """
    data: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ScenarioError(f"scenario file {path} does not exist") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ScenarioError(f"scenario file {path} is not valid TOML: {exc}") from exc
        _check_known_keys(data, Scenario, prefix="", where=where)
        _relative_to(data, Path(path).resolve().parent)
    for key, raw in env_overrides(os.environ if env is None else env).items():
        _set_dotted(data, key, raw, where=f"environment variable {_env_name(key)}")
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value, where=f"option for {key}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{where}: {_one_line(exc)}") from exc


def _relative_to(data: dict[str, Any], root: Path) -> None:
    """A scenario file's relative ``input.data_file`` and ``traffic.trace`` name paths beside
    the file."""
    for name, key in (("input", "data_file"), ("traffic", "trace")):
        section = data.get(name)
        if isinstance(section, dict) and isinstance(section.get(key), str):
            given = Path(section[key]).expanduser()
            if not given.is_absolute():
                section[key] = str(root / given)


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Dotted keys and parsed values from ``PERFSWEEP_<SECTION>_<KEY>`` variables.

    Values are parsed as TOML values when they parse (``50``, ``[1, 8]``, ``true``), as plain
    strings otherwise. Variables that name no known section are ignored: other tools may use
    the prefix (``PERFSWEEP_HOME``), but a known section with an unknown key is an error.
    """
    result: dict[str, Any] = {}
    sections = {name for name in Scenario.model_fields if name != "objective"}
    for name, raw in env.items():
        if not name.startswith(_ENV_PREFIX):
            continue
        rest = name[len(_ENV_PREFIX) :].lower()
        if rest == "objective":
            result["objective"] = raw
            continue
        section = next((s for s in sections if rest.startswith(s + "_")), None)
        if section is None:
            continue
        key = f"{section}.{rest[len(section) + 1 :]}"
        result[key] = _parse_env_value(raw)
    return result


def _env_name(dotted: str) -> str:
    return _ENV_PREFIX + dotted.replace(".", "_").upper()


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _check_known_keys(
    data: Mapping[str, Any], model: type[BaseModel], prefix: str, where: str
) -> None:
    for key, value in data.items():
        if not prefix and key in _READ_AS:
            continue  # checked by the validator that rewrites it (Scenario._models_as_classes)
        field = model.model_fields.get(key)
        if field is None:
            known = ", ".join(model.model_fields)
            raise ScenarioError(
                f"{where}: unknown key '{prefix}{key}' (known keys{_in(prefix)}: {known})"
            )
        sub = field.annotation
        if isinstance(value, Mapping) and isinstance(sub, type) and issubclass(sub, BaseModel):
            _check_known_keys(value, sub, prefix=f"{prefix}{key}.", where=where)


def _in(prefix: str) -> str:
    return f" in [{prefix.rstrip('.')}]" if prefix else ""


def _set_dotted(data: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """Set ``a.b`` in nested dicts, refusing keys the scenario does not have."""
    parts = dotted.split(".")
    model: type[BaseModel] = Scenario
    node = data
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            prefix = ".".join(parts[:depth])
            known = ", ".join(model.model_fields)
            raise ScenarioError(
                f"{where}: unknown key '{dotted}' (known keys{_in(prefix + '.') if prefix else ''}: {known})"
            )
        if depth == len(parts) - 1:
            node[part] = value
            return
        sub = field.annotation
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            raise ScenarioError(f"{where}: '{'.'.join(parts[: depth + 1])}' is not a section")
        node = node.setdefault(part, {})
        model = sub


def _one_line(exc: ValidationError) -> str:
    """The first validation problem as ``key: message`` (pydantic's own text is multi-line)."""
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"unknown key '{loc}'"
    text = f"{loc}: {message}" if loc and not message.startswith(loc) else message
    if error.get("input") is not None and error["type"] not in ("value_error",):
        text += f" (got {error['input']!r})"
    return text


def _to_toml(data: Mapping[str, Any]) -> str:
    """Minimal TOML writer for the scenario's shape (scalars, lists, one level of tables)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            tables.append((key, value))
        elif value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables:
        lines.append("")
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None)
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, Mapping):  # an inline table: input.shapes, a distribution entry
        items = (f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"cannot write {value} to TOML")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))
