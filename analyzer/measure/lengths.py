"""Generative requests' lengths: prompt and output tokens, from distributions or a dataset. Pure.

A generative request carries an input (prompt) length and an output length, in tokens. They
come from one of:

- distributions, one for each (``--input-tokens``, ``--output-tokens``): a fixed number
  (``512``), ``uniform:LO,HI`` (whole numbers, both ends included), or
  ``lognormal:mean=M,sd=S`` (the lengths' own mean and standard deviation, as AIPerf's
  ``--synthetic-input-tokens-mean/-stddev`` give them; rounded, at least 1);
- a dataset (JSONL, one request a line: ``prompt`` (text: its whitespace-separated words are
  its tokens) or ``input_tokens``, and ``output_tokens``), walked in order;
- a trace whose rows carry lengths (:class:`~analyzer.measure.arrivals.Trace` ``lengths``).

:meth:`Lengths.draw` turns them into a seeded list of :class:`GenRequest` that every generator
process draws alike, so one seed is one set of requests.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.errors import InputError

#: Distinct requests drawn from distributions per load (then the list repeats).
DRAWN_REQUESTS = 4096


@dataclass(frozen=True)
class LengthDist:
    """One length distribution: ``fixed`` (``a``), ``uniform`` (``a``..``b``), ``lognormal``
    (mean ``a``, standard deviation ``b``)."""

    kind: str
    a: float
    b: float = 0.0

    def draw(self, rng: random.Random) -> int:
        """One length (a whole number of tokens, at least 1)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.b == 0:
            return max(1, round(self.a))
        sigma2 = math.log(1.0 + (self.b / self.a) ** 2)
        mu = math.log(self.a) - sigma2 / 2.0
        return max(1, round(rng.lognormvariate(mu, math.sqrt(sigma2))))

    def to_text(self) -> str:
        """The flag's form (``512``, ``uniform:100,200``, ``lognormal:mean=512,sd=256``)."""
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)},{int(self.b)}"
        return f"lognormal:mean={self.a:g},sd={self.b:g}"


def parse_length(text: str, flag: str = "--input-tokens") -> LengthDist:
    """A length distribution from its flag form.

    Raises:
        InputError: not one of the forms, or a length below 1.
    """
    raw = text.strip()
    kind, _, rest = raw.partition(":")
    kind = kind.strip().lower()
    forms = f"{flag} takes N, uniform:LO,HI or lognormal:mean=M,sd=S"
    try:
        if not rest:
            value = float(raw)
            if value != int(value) or value < 1:
                raise InputError(f"{flag} must be a whole number of tokens >= 1, got {text!r}")
            return LengthDist("fixed", value)
        if kind == "uniform":
            lo, hi = (float(v) for v in rest.split(","))
            if lo != int(lo) or hi != int(hi) or not 1 <= lo <= hi:
                raise InputError(f"{flag} uniform:LO,HI needs whole 1 <= LO <= HI, got {text!r}")
            return LengthDist("uniform", lo, hi)
        if kind == "lognormal":
            params = dict(p.split("=", 1) for p in rest.split(","))
            params = {k.strip().lower(): v for k, v in params.items()}
            if set(params) != {"mean", "sd"}:
                raise InputError(f"{forms}; got {text!r}")
            mean, sd = float(params["mean"]), float(params["sd"])
            if not mean >= 1 or sd < 0:
                raise InputError(f"{flag} lognormal needs mean >= 1 and sd >= 0, got {text!r}")
            return LengthDist("lognormal", mean, sd)
    except (ValueError, TypeError):
        raise InputError(f"{forms}; got {text!r}") from None
    raise InputError(f"{forms}; got {text!r}")


@dataclass(frozen=True)
class GenRequest:
    """One generative request: its prompt length, its output length and (from a dataset) its
    own prompt text."""

    input_tokens: int
    output_tokens: int
    prompt: str | None = None


def parse_dataset(text: str, source: str) -> tuple[GenRequest, ...]:
    """The requests of a JSONL dataset (``source`` names it in errors).

    Raises:
        InputError: a line that is not a JSON object, or that gives no input length (``prompt``
            or ``input_tokens``) or no ``output_tokens``; the message names the line.
    """
    out: list[GenRequest] = []
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"dataset {source}:{line}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"dataset {source}:{line}: each line must be a JSON object")
        prompt = record.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise InputError(f"dataset {source}:{line}: 'prompt' must be text")
        given = record.get("input_tokens")
        if given is None and prompt is None:
            raise InputError(
                f"dataset {source}:{line}: no input length; give 'prompt' (text) or "
                "'input_tokens' (a whole number) on every line"
            )
        if "output_tokens" not in record:
            raise InputError(
                f"dataset {source}:{line}: no 'output_tokens'; give every line the number "
                "of tokens to generate"
            )
        inputs = (
            _count(given, "input_tokens", source, line)
            if given is not None
            else max(1, len(str(prompt).split()))
        )
        output = _count(record["output_tokens"], "output_tokens", source, line)
        out.append(GenRequest(inputs, output, prompt))
    if not out:
        raise InputError(f"dataset {source} holds no request")
    return tuple(out)


def _count(value: object, key: str, source: str, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise InputError(f"dataset {source}:{line}: {key!r} must be a whole number, not {value!r}")
    if value < 1:
        raise InputError(f"dataset {source}:{line}: {key!r} must be >= 1, not {value!r}")
    return int(value)


@dataclass(frozen=True)
class Lengths:
    """Where a load's requests get their lengths: distributions, or a dataset's requests."""

    input: LengthDist = LengthDist("fixed", 128)
    output: LengthDist = LengthDist("fixed", 64)
    #: A dataset's requests, in order (empty: the distributions).
    dataset: tuple[GenRequest, ...] = ()
    #: The dataset's file name (recorded so a run says what it sent).
    source: str = ""

    def draw(self, seed: int, count: int = DRAWN_REQUESTS) -> list[GenRequest]:
        """The load's requests: the dataset's, or ``count`` seeded draws."""
        if self.dataset:
            return list(self.dataset)
        rng = random.Random(seed * 7_919 + 17)
        return [GenRequest(self.input.draw(rng), self.output.draw(rng)) for _ in range(count)]

    def describe(self) -> str:
        """One line for the console and the records."""
        if self.dataset:
            return f"dataset {self.source} ({len(self.dataset)} requests)"
        return f"input {self.input.to_text()} tokens, output {self.output.to_text()} tokens"

    def record(self) -> dict[str, Any]:
        """What a result's environment records of its requests (``requests``): the one line,
        both distributions' forms and the dataset's file name (None: none)."""
        return {
            "lengths": self.describe(),
            "input_tokens": self.input.to_text(),
            "output_tokens": self.output.to_text(),
            "dataset": self.source or None,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain values (they cross to the generator processes)."""
        return {
            "input": self.input.to_text(),
            "output": self.output.to_text(),
            "dataset": [[r.input_tokens, r.output_tokens, r.prompt] for r in self.dataset],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lengths:
        """Inverse of :meth:`to_dict`."""
        rows: Sequence[Sequence[Any]] = data.get("dataset") or ()
        return cls(
            parse_length(str(data.get("input", "128"))),
            parse_length(str(data.get("output", "64")), "--output-tokens"),
            tuple(GenRequest(int(a), int(b), p) for a, b, p in rows),
            str(data.get("source", "")),
        )


def prompt_words(count: int, salt: int) -> str:
    """A prompt of ``count`` words (the reference engine's tokens): distinct per ``salt``, so
    that requests share no prefix a cache could reuse."""
    rng = random.Random(salt)
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(count))


def prompt_ids(count: int, salt: int, low: int = 100, high: int = 1000) -> list[int]:
    """A prompt of ``count`` token ids in ``[low, high)`` (``/v1/completions`` takes them
    as its prompt: exact lengths without a tokenizer)."""
    rng = random.Random(salt)
    return [rng.randrange(low, high) for _ in range(count)]
