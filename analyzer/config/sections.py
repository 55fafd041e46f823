"""The sections of a scenario: one frozen pydantic model per ``[section]`` of the file.

``[model]``, ``[input]``, ``[goals]``, ``[space]``, ``[budget]``, ``[search]``, ``[run]`` and
``[gate]``; ``[traffic]`` with its request classes is in :mod:`analyzer.config.traffic`.
Unknown keys are refused (``extra="forbid"``). :class:`~analyzer.config.scenario.Scenario`
holds one of each.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from analyzer.config.access import ServerAccess
from analyzer.config.urls import http_url

PositiveFloat = Annotated[float, Field(gt=0)]

#: The protocols of a generative model's token streams (``model.protocol``; ``--protocol``).
STREAM_PROTOCOLS = ("grpc-stream", "generate-stream", "openai", "openai-chat")


def stream_protocol(protocol: str, openai: bool = False) -> str:
    """The token stream a generative model's load speaks where ``protocol`` names a transport:
    over HTTP Triton's ``generate_stream`` (``openai``: OpenAI's ``/v1/completions``, a server
    started from a command), over gRPC ``ModelStreamInfer``; a stream protocol is kept."""
    if protocol == "http":
        return "openai" if openai else "generate-stream"
    if protocol == "grpc":
        return "grpc-stream"
    return protocol


class Section(BaseModel):
    """A ``[section]`` of the scenario: frozen, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(Section):
    """Which model to tune and where it is served."""

    name: str = "resnet50"
    """Model name: a bundled model (``resnet50``) or a model in ``repository`` / at ``url``."""
    repository: Path | None = None
    """Model repository directory served by the managed reference server (own models)."""
    composing_models: tuple[str, ...] = ()
    """The models a pipeline calls, tuned together while load goes to ``name``: required for a
    BLS model (its calls are in its code), optional for an ensemble (default: every model its
    steps call; naming some tunes only those)."""
    url: str | None = None
    """HTTP URL of a running server (real Triton or reference server); no server is started."""
    server: Literal["reference", "triton", "virtual"] = "reference"
    """Which server perfsweep starts and manages: the bundled ``reference`` server, a real
    ``triton`` (``tritonserver`` on loopback, explicit model control, the user's
    ``repository``), or ``virtual``: no server at all, the reference server's simulated device
    simulated in virtual time (``perfsweep run`` only: each model's simulated-device profile,
    a sweep of 20 trials in seconds; its figures are the simulator's, not measurements).
    Ignored with ``url``: nothing is started then."""
    triton_server_path: Path | None = None
    """The ``tritonserver`` binary of ``server = "triton"`` (default: found on ``PATH``). Not
    part of :meth:`Scenario.hash`: where the binary lies changes no measurement."""
    device: Literal["auto", "sim", "cpu", "cuda"] = "auto"
    """Device of the managed reference server: real ONNX Runtime (``auto``/``cpu``/``cuda``) or the
    simulated latency profile (``sim``). Ignored with ``url``."""
    protocol: Literal["http", "grpc", "grpc-stream", "generate-stream", "openai", "openai-chat"] = (
        "http"
    )
    """Inference protocol the load generator speaks. A generative model's token streams:
    ``grpc-stream`` (Triton's ModelStreamInfer), ``generate-stream`` (Triton's
    ``generate_stream``), ``openai`` (``/v1/completions``), ``openai-chat``
    (``/v1/chat/completions``); each trial then measures TTFT, ITL, tokens/s and goodput."""
    serve_command: str | None = None
    """A generative server that takes its settings on the command line (``vllm serve``,
    SGLang): the command that starts it, with the knobs as placeholders (``{max_num_seqs}``,
    ``{max_num_batched_tokens}``, ``{enable_chunked_prefill}``, ``{gpu_memory_utilization}``,
    or the engine's own names) and ``{port}``; perfsweep starts it per config on loopback,
    waits until it is ready and stops it at the end. ``url`` is then left out."""
    engine: Literal["vllm", "tensorrtllm", "sglang"] | None = None
    """The generative engine behind ``serve_command`` (whose names its placeholders may use);
    default ``vllm``. A Triton model's engine is read from its backend."""
    metrics_url: str | None = None
    """Prometheus ``/metrics`` URL of the ``url`` server (Triton: HTTP port + 2), read for GPU
    utilisation, memory and power per window; a managed server's is discovered."""
    grpc_url: str | None = None
    """gRPC ``host:port`` of the ``url`` server (default: its HTTP port + 1, Triton's layout)."""
    ssl_ca: Path | None = None
    """CA bundle (PEM) that signs the server's certificate: ``https://`` URLs and gRPC over
    TLS (default: the system's CAs). With gRPC, any ``ssl_*`` key turns TLS on."""
    ssl_cert: Path | None = None
    """Client certificate (PEM) for mutual TLS."""
    ssl_key: Path | None = None
    """The client certificate's private key (PEM; default: inside ``ssl_cert``)."""
    ssl_insecure: bool = False
    """Do not verify the server's certificate (self-signed test servers; warned on every run)."""
    headers: tuple[tuple[str, str], ...] = Field(default=(), exclude=True, repr=False)
    """Headers every request carries (``--header``, ``--header-file``): never dumped, so never
    in ``scenario.toml``, the hash or a record (:mod:`analyzer.config.access`)."""
    startup_timeout_s: PositiveFloat = 180.0
    """How long to wait for a managed server (and its first model load) to become ready."""
    cache_size_bytes: Annotated[int, Field(ge=0)] = 64 * 2**20
    """Response cache of a managed server (``--cache-config local,size=...``), bytes; only
    models whose config enables ``response_cache`` use it; 0 = no cache."""

    @field_validator("url")
    @classmethod
    def _scheme_for_a_bare_address(cls, url: str | None) -> str | None:
        # ``--url 127.0.0.1:8000`` (perf_analyzer's form) means plain HTTP, as everywhere a URL
        # enters; another scheme is left for the scenario's check, which names the key.
        if url is not None and "://" not in url:
            return http_url(url)
        return url

    def access(self) -> ServerAccess:
        """The TLS files and headers of every request to this model's server."""
        return ServerAccess.of(
            self.ssl_ca, self.ssl_cert, self.ssl_key, self.ssl_insecure, self.headers
        )


Dims = tuple[Annotated[int, Field(ge=0)], ...]


class ShapeWeight(Section):
    """One shape of a variable-length mix (``[[input.distribution]]``)."""

    shapes: dict[str, Dims]
    """Dims of each variable input, batch dim left out (``{IDS = [128]}``)."""
    weight: PositiveFloat = 1.0
    """Relative share of the random payloads that take these shapes."""

    @field_validator("shapes")
    @classmethod
    def _some_shapes(cls, shapes: dict[str, Dims]) -> dict[str, Dims]:
        if not shapes:
            raise ValueError("a distribution entry needs shapes = {NAME = [dims]}")
        return shapes


class InputSection(Section):
    """What each request carries (the same for ``run``, ``gate``, ``load`` and ``ui``)."""

    data: Literal["random", "zeros"] = "random"
    """Tensor contents without a ``data_file``: seeded random values (every Triton dtype gets
    data of its kind) or zeros."""
    batch_size: Annotated[int, Field(ge=1)] = 1
    """Samples per request (the client batch size)."""
    shapes: dict[str, Dims] | None = None
    """Dims of inputs with a variable (``-1``) dim other than the batch, batch dim left out
    (``{IDS = [128], MASK = [128]}``; perf_analyzer's ``--shape``)."""
    data_file: Path | None = None
    """perf_analyzer's ``--input-data`` JSON (every form it takes), an ``.npz`` (leading axis =
    entries) or a directory with one raw file per input. Relative to the scenario file (to the
    working directory from a flag). Requests rotate through its entries in order."""
    data_sha256: str | None = None
    """SHA-256 of ``data_file`` (a directory: of its file names and bytes), filled in when the
    scenario is built and recorded with it. A value that differs from the file's refuses the
    scenario: a resumed run whose data changed is not continued."""
    unique_payloads: int | None = None
    """Distinct random payloads per generator process (default 8192, fewer for large inputs).
    Random data only."""
    repeat_ratio: float = 0.0
    """Share of random requests that repeat an earlier payload: the hit ratio a response cache
    that holds them all sees (0 = no repeat within the rotation). Random data only."""
    distribution: tuple[ShapeWeight, ...] = ()
    """Variable-length mix: each random payload takes one entry's shapes, drawn by weight
    (sequence-length mixes decide the batching gain of NLP models). Random data only."""
    pad_buckets: tuple[Annotated[int, Field(ge=1)], ...] | Literal["auto"] | None = None
    """Pad every request's variable dims up to the nearest of these lengths, as a client that
    buckets its requests does (``[64, 128, 256]``; ``"auto"``: four buckets at the quartiles of
    the data's lengths): requests of one bucket share a shape, so Triton can batch them without
    ``allow_ragged_batch``. The sweep measures, and the recommendation names, that traffic."""
    pad_values: dict[str, float] | None = None
    """The value padding fills each variable input with (``{IDS = 0, MASK = 0}``); one per
    variable input when ``pad_buckets`` is set."""
    shared_memory: Literal["none", "system"] = "none"
    """Where request tensors travel: ``none``, in every request; ``system``, written once per
    generator process into a registered system shared-memory region that each request names
    (perf_analyzer's ``--shared-memory system``: a 600 KB tensor costs a request a few hundred
    bytes). The server must run on this host."""

    @model_validator(mode="after")
    def _check_source(self) -> InputSection:
        # The words of analyzer.load.inputs.InputOptions, which ``perfsweep load`` users know.
        if self.unique_payloads is not None and self.unique_payloads < 1:
            raise ValueError(
                f"input.unique_payloads: unique payloads must be >= 1, got {self.unique_payloads}"
            )
        if not 0.0 <= self.repeat_ratio < 1.0:
            raise ValueError(
                f"input.repeat_ratio: repeat ratio must be in [0, 1), got {self.repeat_ratio:g}"
            )
        if self.data_file is not None and self.data == "zeros":
            raise ValueError("input.data_file replaces input.data; leave input.data out")
        random_only = {
            "unique_payloads": self.unique_payloads is not None,
            "repeat_ratio": bool(self.repeat_ratio),
            "distribution": bool(self.distribution),
        }
        given = [name for name, on in random_only.items() if on]
        if given and (self.data_file is not None or self.data == "zeros"):
            source = "a data_file" if self.data_file is not None else "zeros"
            raise ValueError(
                f"input.{given[0]}: unique payloads, repeat ratio and distribution apply to "
                f"random data, not {source} (a data file's entries are its rotation)"
            )
        if self.data_file is None and self.data_sha256 is not None:
            raise ValueError("input.data_sha256 needs input.data_file")
        if self.data_file is not None:
            path = self.data_file.resolve()
            object.__setattr__(self, "data_file", path)  # frozen: made absolute once, here
            if not path.exists():
                raise ValueError(
                    f"input.data_file {path}: no such file or directory (a perf_analyzer .json, "
                    "an .npz, or a directory with one file per input)"
                )
            digest = pinned_digest("input.data_file", path, self.data_sha256)
            object.__setattr__(self, "data_sha256", digest)  # frozen: filled in once, here
        return self

    @model_serializer(mode="wrap")
    def _leave_out_no_shared_memory(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Inputs in the requests (the default) dump as before the key existed: records, TOML
        # and the hashes of older scenarios stay as they were.
        data: dict[str, Any] = handler(self)
        if data.get("shared_memory") == "none":
            data.pop("shared_memory", None)
        return data

    def identity(self) -> dict[str, Any]:
        """The section as far as it decides what is measured (JSON-able, for fingerprints): a
        data file by its bytes (``data_sha256``), not by where it lies; shapes, unique payloads,
        repeat ratio, distribution and shared memory left out at their defaults, so gate
        measurements of scenarios written before those keys keep their fingerprints."""
        data: dict[str, Any] = json.loads(self.model_dump_json())
        data.pop("data_file", None)
        for key, default in (
            ("shapes", None),
            ("data_sha256", None),
            ("unique_payloads", None),
            ("repeat_ratio", 0.0),
            ("distribution", []),
            ("shared_memory", "none"),
        ):
            if data.get(key, default) == default:
                data.pop(key, None)
        return data

    @property
    def mode(self) -> Literal["random", "zeros", "file"]:
        """Where values come from: ``file`` with a ``data_file``, else ``data``."""
        return "file" if self.data_file is not None else self.data


def pinned_digest(key: str, path: Path, recorded: str | None) -> str:
    """``path``'s digest (:func:`data_digest`), which must be ``recorded`` when a scenario
    recorded one: a resumed run measures the same bytes (``ValueError`` naming ``key``)."""
    digest = data_digest(path)
    if recorded is not None and recorded != digest:
        raise ValueError(
            f"{key} {path} changed since this scenario was recorded (sha256 {digest[:12]}..., "
            f"recorded {recorded[:12]}...): restore the file, or start a new run"
        )
    return digest


def data_digest(path: Path) -> str:
    """SHA-256 of a data file, or of a directory's file names and bytes (sorted by name)."""
    h = hashlib.sha256()
    if path.is_dir():
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            name = item.relative_to(path).as_posix().encode()
            h.update(len(name).to_bytes(4, "little") + name)
            h.update(item.stat().st_size.to_bytes(8, "little"))
            with item.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    else:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class GoalsSection(Section):
    """What counts as acceptable service."""

    p99_ms: PositiveFloat = 100.0
    """99th-percentile latency goal in milliseconds."""
    min_throughput_rps: Annotated[float, Field(ge=0)] = 0.0
    """A config must sustain at least this throughput (requests/s) to meet the goals."""
    max_error_rate: Annotated[float, Field(ge=0, lt=1)] = 0.01
    """Largest acceptable fraction of failed requests."""
    max_gpu_memory_mb: PositiveFloat | None = None
    """Peak GPU memory (MiB, the most of any GPU the server reports) a config may use at its
    operating point; a config above it, or one measured without GPU metrics, misses the goals."""
    ttft_p99_ms: PositiveFloat | None = None
    """A generative model's p99 time-to-first-token goal, milliseconds (with ``itl_p99_ms``,
    ``p99_ms`` is then the end-to-end cap, open unless given)."""
    itl_p99_ms: PositiveFloat | None = None
    """A generative model's p99 inter-token-latency goal (over tokens), milliseconds."""
    note: str = ""
    """Why these goals (printed after them: ``goal p99 <= 500 ms: <note>``). Not part of
    :meth:`Scenario.hash`: it changes no measurement."""


class SpaceSection(Section):
    """Bounds of the searched knobs. Every point inside them is a config Triton accepts."""

    max_batch_size: tuple[int, int] = (1, 32)
    """Inclusive bounds of ``max_batch_size``; both powers of two (searched as 2^k)."""
    max_queue_delay_us: tuple[int, int] = (0, 10000)
    """Inclusive bounds of ``max_queue_delay_microseconds``."""
    delay_steps: Annotated[int, Field(ge=1, le=32)] = 8
    """How many delay values to search: 0 (when inside the bounds) and a geometric ladder."""
    preferred_batch_size: Literal["auto", "none"] | tuple[int, ...] = "auto"
    """``auto``: search 0-2 preferred sizes derived from the max batch size (mbs, mbs/2);
    ``none``: never set preferred sizes; a list: always use exactly these sizes."""
    instance_count: tuple[int, int] = (1, 4)
    """Inclusive bounds of the instance count (``instance_group[0].count``)."""
    response_cache: Literal["off", "on", "search"] | None = None
    """``response_cache { enable }`` of every trial: ``off``/``on`` force it, ``search`` tries
    both; unset: as the model's config says. Refused for sequence-batched or decoupled models.
    A run with the cache on and repeated inputs (``[input] repeat_ratio``) states the hit ratio
    next to every throughput."""
    ragged_batch: Literal["off", "on", "search"] | None = None
    """``allow_ragged_batch`` of every input with a variable dimension: ``on`` lets requests of
    different shapes share a batch, ``off`` batches equal shapes only (Triton's default), and
    ``search`` tries both; unset: as the model's config says. Opt-in: the backend must accept
    ragged batches (the Python backend gets the requests one by one; other backends need a
    ``batch_input``), and the recommendation says when it is on."""
    queue_policy: Literal["off", "search"] | None = None
    """Priority levels and queue policies of every trial's dynamic batcher: ``off`` clears them
    (one FIFO queue, no timeouts); ``search`` tries that FIFO, the traffic's priority levels
    alone, and the lowest level rejecting (REJECT) or demoting (DELAY) its requests after 0.5,
    1 and 2x its classes' p99 goal; unset: as the model's config says. ``search`` needs a
    priority mix (``traffic.classes`` with two levels or more) and is refused for a model with
    ``preserve_ordering``. Predict cannot simulate priorities: it predicts only FIFO configs."""
    instance_kind: tuple[Literal["KIND_CPU", "KIND_GPU"], ...] | None = None
    """Instance kinds to search for the model's one instance group, e.g. ``["KIND_GPU",
    "KIND_CPU"]`` where both make sense (a GPU server whose backend also runs on the CPU);
    None keeps the model's own kind."""
    max_candidate_sequences: tuple[int, ...] | None = None
    """Values of ``sequence_batching.oldest.max_candidate_sequences`` to search (a stateful
    model with the oldest strategy: how many sequences per instance may have a request in the
    batcher at once; the rest wait for a slot); unset: as the model's config says. Refused for
    a model without the oldest strategy."""
    max_num_seqs: tuple[int, ...] | None = None
    """A generative engine's running-set sizes to search (vLLM's ``max_num_seqs``,
    TensorRT-LLM's runtime ``max_batch_size``, SGLang's ``--max-running-requests``); unset:
    1, 2, 4 ... 64."""
    max_num_batched_tokens: tuple[int, ...] | None = None
    """A generative engine's step token budgets to search (vLLM's ``max_num_batched_tokens``,
    TensorRT-LLM's ``max_num_tokens``, SGLang's ``--max-prefill-tokens``); unset: 512, 2048,
    8192."""
    enable_chunked_prefill: Literal["off", "on", "search"] | None = None
    """Chunked prefill of a generative engine: ``off``/``on`` force it, ``search`` tries both;
    unset: as the engine's own settings say."""
    gpu_memory_utilization: tuple[float, ...] | None = None
    """A generative engine's memory shares to search (the KV cache is what the weights leave
    of it: vLLM's ``gpu_memory_utilization``, TensorRT-LLM's
    ``kv_cache_free_gpu_mem_fraction``, SGLang's ``--mem-fraction-static``); unset: the
    engine's own."""

    @model_validator(mode="after")
    def _check_bounds(self) -> SpaceSection:
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            values = getattr(self, key)
            if values is not None and (not values or min(values) < 1):
                raise ValueError(f"space.{key}: need one or more values >= 1, got {list(values)}")
        shares = self.gpu_memory_utilization
        if shares is not None and (not shares or not all(0 < v <= 1 for v in shares)):
            raise ValueError(
                f"space.gpu_memory_utilization: need one or more shares in (0, 1], got "
                f"{list(shares)}"
            )
        if self.max_candidate_sequences is not None and (
            not self.max_candidate_sequences or min(self.max_candidate_sequences) < 1
        ):
            raise ValueError(
                "space.max_candidate_sequences: need one or more values >= 1, got "
                f"{list(self.max_candidate_sequences)}"
            )
        lo, hi = self.max_batch_size
        for value in (lo, hi):
            if value < 1 or value & (value - 1):
                raise ValueError(
                    f"space.max_batch_size bounds must be powers of two >= 1, got {value}"
                )
        if lo > hi:
            raise ValueError(f"space.max_batch_size: lower bound {lo} is above upper bound {hi}")
        dlo, dhi = self.max_queue_delay_us
        if dlo < 0 or dlo > dhi:
            raise ValueError(
                f"space.max_queue_delay_us: need 0 <= lower <= upper, got {dlo}, {dhi}"
            )
        ilo, ihi = self.instance_count
        if ilo < 1 or ilo > ihi:
            raise ValueError(f"space.instance_count: need 1 <= lower <= upper, got {ilo}, {ihi}")
        if isinstance(self.preferred_batch_size, tuple):
            sizes = self.preferred_batch_size
            if not sizes or min(sizes) < 1:
                raise ValueError("space.preferred_batch_size: sizes must be >= 1")
            if max(sizes) > hi:
                raise ValueError(
                    f"space.preferred_batch_size: preferred size {max(sizes)} is above the "
                    f"largest max_batch_size {hi}; Triton refuses such a config "
                    "(raise space.max_batch_size or drop the size)"
                )
        return self


class BudgetSection(Section):
    """How much time the sweep may spend, and how carefully it measures."""

    trials: Annotated[int, Field(ge=1)] = 20
    """Search trials (the baseline and validation runs come on top)."""
    time_budget_s: PositiveFloat | None = None
    """Stop starting new trials after this many seconds (validation still runs)."""
    patience: Annotated[int, Field(ge=1)] = 8
    """Stop after this many finished trials without a feasible improvement of min_improvement."""
    min_improvement: Annotated[float, Field(ge=0)] = 0.01
    """Relative gain that counts as an improvement (0.01 = 1 %)."""
    warmup_s: Annotated[float, Field(ge=0)] = 2.0
    """Warm-up after each config load; its samples are discarded."""
    window_s: PositiveFloat = 4.0
    """Shortest measurement window, seconds (a load level measures two windows)."""
    min_requests: Annotated[int, Field(ge=1)] = 200
    """A window lasts until it holds at least this many requests (a p99 from fewer requests is
    decided by one or two outliers)."""
    capacity_resolution: Annotated[float, Field(gt=0, lt=1)] = 0.1
    """The capacity search stops when its bracket is narrower than this fraction (0.1 = 10 %)."""
    validate_top: Annotated[int, Field(ge=0)] = 3
    """How many of the best feasible configs are re-measured before one is chosen."""
    validate_repeats: Annotated[int, Field(ge=1)] = 2
    """Repeats per validated config; the best worst case wins."""
    validate_window_factor: Annotated[float, Field(ge=1)] = 2.0
    """Validation windows are this many times longer than search windows."""
    validation: Literal["check", "repeats"] = "check"
    """``check``: the winner is measured once at its capacity less ``capacity_resolution``, the
    runner-up once at the winner's capacity, with the sequential test, whole capacities again
    only when the two are within noise, the baseline not again (a capacity objective in open
    loop; otherwise ``repeats``);
    ``repeats``: each of the ``validate_top`` best configs and the baseline
    ``validate_repeats`` times (a gain interval from repeats on both sides)."""
    sequential: bool = True
    """Open-loop capacity steps are sequential (``LoadSpec.sequential``): a step stops as soon as
    ``p99 <= goal`` is statistically decided (PASS/FAIL), or at ``sequential_max_requests``
    (BOUNDARY), instead of after fixed windows. ``false``: fixed windows (the only way before sequential steps)."""
    sequential_max_requests: Annotated[int, Field(ge=200)] = 10_000
    """Cap of one sequential step: a step still undecided after this many requests is reported
    at the boundary."""


class SearchSection(Section):
    """How the configs to measure are chosen (``perfsweep run --search``)."""

    strategy: Literal["predict", "tpe", "random", "grid"] = "predict"
    """``predict``: profile the server's execution times, simulate every config's capacity and
    measure the predicted best first (falls back to ``tpe`` where no profile can be taken:
    closed loop, a fixed-load objective, a probe that fails); ``tpe``: Optuna's TPE after the
    sensible seeds; ``random``: Optuna's RandomSampler (seeded); ``grid``: every config of the
    space, bounded by ``budget.trials``."""
    band: Annotated[float, Field(gt=0, lt=1)] = 0.1
    """Half-width of a prediction's band, as a share of the predicted capacity (0.1 = +-10 %):
    ``predict`` stops once the measured best lies in the band of the predicted best."""
    profile_time_s: PositiveFloat = 60.0
    """Time budget of the profile phase (``predict``), seconds."""


class RunSection(Section):
    """Where results go and how the search is seeded and stored."""

    output_dir: Path = Path("reports")
    """Root of run directories (``<output_dir>/<run-id>/``)."""
    seed: int = 0
    """Seed of the sampler and of the generated load."""
    sampler: Literal["tpe", "random"] = "tpe"
    """Optuna sampler of the trials a strategy does not choose itself (``search.strategy`` tpe,
    and predict's fall-back); ``search.strategy = "random"`` uses ``random`` whatever this says."""
    storage: str | None = None
    """Optuna storage URL (``postgresql://...``) shared by several workers; default: a journal
    file in the run directory."""
    study_name: str | None = None
    """Study name in a shared storage; several workers with the same name share one study."""
    leave: Literal["original", "best"] = "original"
    """What a shared server (``model.url``) holds when the run ends, fails or is interrupted:
    the model's ``original`` config, sent back explicitly, or the ``best`` config found (the
    original when none met the goals). A managed server is stopped either way. Not part of
    :meth:`Scenario.hash`: it changes no measurement."""
    server_wait_s: Annotated[float, Field(ge=0)] = 60.0
    """How long a shared server (``model.url``) that stopped answering mid-run is waited for,
    seconds (health polled every second): back in time (a restarted pod), its trial runs again
    and the outage is recorded; not back, the run stops with exit status 3. A managed server
    is restarted instead. Not part of :meth:`Scenario.hash`: it changes no measurement."""
    report: bool = True
    """Render ``report.html`` when the run ends (``--no-report``: a pipeline that reads
    ``summary.json`` only; ``perfsweep report RUN_DIR`` renders it later). Not part of
    :meth:`Scenario.hash`: it changes no measurement."""


class GateSection(Section):
    """Criteria of ``perfsweep gate`` (CI performance gate). ``perfsweep run`` ignores this table,
    and it is not part of :meth:`Scenario.hash`: changing a threshold changes no measurement."""

    p99_ms: PositiveFloat | None = None
    """The candidate's p99 latency must be at most this many milliseconds."""
    min_throughput_rps: Annotated[float, Field(ge=0)] | None = None
    """The candidate's throughput must be at least this many requests/s."""
    max_error_rate: Annotated[float, Field(ge=0, lt=1)] | None = None
    """The candidate's fraction of failed requests must be at most this."""
    ttft_p99_ms: PositiveFloat | None = None
    """A generative model: the candidate's time to first token, p99, must be at most this many
    milliseconds."""
    itl_p99_ms: PositiveFloat | None = None
    """A generative model: the candidate's inter-token latency, p99 over tokens, must be at most
    this many milliseconds."""
    min_tokens_per_s: Annotated[float, Field(ge=0)] | None = None
    """A generative model: the candidate must generate at least this many output tokens/s."""
    max_regression_pct: Annotated[float, Field(gt=0, lt=100)] | None = None
    """Against a baseline: fail when throughput or p99 (for token streams also TTFT p99, ITL p99
    or tokens/s) is worse by more than this percentage and the change is statistically
    significant."""
    alpha: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    """Significance level of the one-sided rank test behind a regression verdict."""
    repeats: Annotated[int, Field(ge=1)] = 3
    """Measure-and-gate mode: measurements per target (interleaved with a live baseline)."""
    baseline: str | None = None
    """A baseline result (run directory, summary.json or ``perfsweep load`` output)."""
