"""Model configuration: parse, normalize, validate and render Triton's ``ModelConfig``.

config.pbtxt files and repository ``load`` overrides are read only through Triton's own protobuf
(``tritonclient.grpc.model_config_pb2``) with ``google.protobuf.text_format`` /
``json_format``: there is no hand-written parser. Normalization and validation follow
``core/src/model_config_utils.cc`` (``research/triton_spec.md`` §2.2) and raise
:class:`~reference_server.core.errors.ModelConfigError` with Triton's messages.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.ensemble_config import check_graph, is_ensemble
from reference_server.core.errors import ModelConfigError

ModelConfig = mc.ModelConfig

#: Most instances one model may have (all instance groups together). Each instance is a thread
#: (and, for ONNX, a session) of this process; Triton has no cap, and 10,000 took 12 s and as
#: many threads to start. Far above what one host can use for one model.
MAX_INSTANCES_PER_MODEL = 64
#: Triton's ``SEQUENCE_IDLE_DEFAULT_MICROSECONDS``: idle sequences lose their slot after 1 s.
SEQUENCE_IDLE_DEFAULT_US = 1_000_000

#: config data type -> KServe protocol datatype.
_TYPE_TO_PROTOCOL = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_UINT8: "UINT8",
    mc.TYPE_UINT16: "UINT16",
    mc.TYPE_UINT32: "UINT32",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT8: "INT8",
    mc.TYPE_INT16: "INT16",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_FP16: "FP16",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_FP64: "FP64",
    mc.TYPE_STRING: "BYTES",
    mc.TYPE_BF16: "BF16",
}
_PROTOCOL_TO_NUMPY: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
    # numpy has no bfloat16: BF16 payloads travel as raw uint16 words.
    "BF16": np.uint16,
}

# §2.4: int64 fields that Triton renders as JSON numbers (paths of field names; "*" = each item).
_INT64_AS_NUMBER = (
    ("input", "*", "dims"),
    ("input", "*", "reshape", "shape"),
    ("output", "*", "dims"),
    ("output", "*", "reshape", "shape"),
    ("version_policy", "specific", "versions"),
    ("dynamic_batching", "max_queue_delay_microseconds"),
    ("dynamic_batching", "priority_levels"),
    ("dynamic_batching", "default_priority_level"),
    ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
    ("dynamic_batching", "priority_queue_policy", "**", "default_timeout_microseconds"),
    ("sequence_batching", "max_sequence_idle_microseconds"),
    ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
    ("sequence_batching", "direct", "max_queue_delay_microseconds"),
    ("sequence_batching", "state", "*", "dims"),
    ("ensemble_scheduling", "step", "*", "model_version"),
    ("model_warmup", "*", "inputs", "**", "dims"),
)


def protocol_datatype(data_type: int) -> str:
    """Return the KServe datatype name (``"FP32"``) of a config ``DataType`` value."""
    return _TYPE_TO_PROTOCOL.get(data_type, "INVALID")


def numpy_dtype(datatype: str) -> Any:
    """Return the numpy dtype used for a KServe datatype (object for BYTES)."""
    return _PROTOCOL_TO_NUMPY[datatype]


def parse_config_text(text: str) -> mc.ModelConfig:
    """Parse config.pbtxt text into a ``ModelConfig``.

    Raises:
        ModelConfigError: the text is not a valid ModelConfig in protobuf text format.
    """
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"failed to parse model configuration: {exc}") from exc


def load_config_file(path: Path) -> mc.ModelConfig:
    """Read and parse a config.pbtxt file (not normalized)."""
    return parse_config_text(Path(path).read_text(encoding="utf-8"))


def config_from_json(text: str) -> mc.ModelConfig:
    """Parse a repository ``load`` config override (ModelConfig as a JSON string).

    Raises:
        ModelConfigError: with Triton's ``Invalid config override: ...`` message.
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise ModelConfigError(f"Invalid config override: not JSON: {reason}") from None
    if not isinstance(value, dict):
        raise ModelConfigError("Invalid config override: the config must be a JSON object")
    try:
        return json_format.ParseDict(value, mc.ModelConfig())
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise ModelConfigError(f"Invalid config override: {exc}") from exc


def config_to_text(cfg: mc.ModelConfig) -> str:
    """Render a config as protobuf text format (what a config.pbtxt file holds)."""
    return text_format.MessageToString(cfg)


def config_to_json(cfg: mc.ModelConfig) -> dict[str, Any]:
    """Render a config as Triton's GET ``.../config`` JSON (§2.4).

    Proto field names, every field printed, enums by name, and the listed int64 fields turned
    from JSON strings into numbers.
    """
    out = json_format.MessageToDict(
        cfg,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    for path in _INT64_AS_NUMBER:
        _int64_to_number(out, path)
    # A field newer than Triton 2.51, which does not print it.
    out.get("ensemble_scheduling", {}).pop("max_inflight_requests", None)
    return out


def _int64_to_number(node: Any, path: Sequence[str]) -> None:
    if not path or not isinstance(node, dict):
        return
    head, rest = path[0], path[1:]
    if head == "*":
        raise AssertionError("'*' must follow a list field")
    if head not in node:
        return
    value = node[head]
    if rest and rest[0] == "*" and isinstance(value, list):
        for item in value:
            _int64_to_number(item, rest[1:])
    elif rest and rest[0] == "**" and isinstance(value, dict):
        # A map: apply the rest to each value.
        for item in value.values():
            _int64_to_number(item, rest[1:])
    elif rest and rest[0] == "**" and isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                for sub in item.values():
                    _int64_to_number(sub, rest[1:])
    elif not rest:
        if isinstance(value, list):
            node[head] = [int(v) for v in value]
        elif isinstance(value, str):
            node[head] = int(value)
    else:
        _int64_to_number(value, rest)


def normalize(
    cfg: mc.ModelConfig, *, model_name: str = "", gpu_ids: Sequence[int] = ()
) -> mc.ModelConfig:
    """Return a normalized copy of ``cfg``, as Triton fills defaults before loading.

    Args:
        cfg: The parsed config (left unchanged).
        model_name: Directory name, used when the config has no name.
        gpu_ids: GPUs present on this host (decides KIND_AUTO and KIND_GPU defaults).
    """
    out = copy.deepcopy(cfg)
    if not out.name:
        out.name = model_name
    if out.platform == "onnxruntime_onnx" and not out.backend:
        out.backend = "onnxruntime"
    if not out.HasField("version_policy"):
        out.version_policy.latest.num_versions = 1
    if (
        out.HasField("dynamic_batching")
        and not out.dynamic_batching.preferred_batch_size
        and out.max_batch_size > 0
    ):
        out.dynamic_batching.preferred_batch_size.append(out.max_batch_size)
    if out.HasField("sequence_batching"):
        sb = out.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and out.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(out.max_batch_size)
    if out.backend != "ensemble" and out.platform != "ensemble":
        if not out.optimization.HasField("input_pinned_memory"):
            out.optimization.input_pinned_memory.enable = True
        if not out.optimization.HasField("output_pinned_memory"):
            out.optimization.output_pinned_memory.enable = True
    if is_ensemble(out):
        # Triton records whether a step's model is decoupled; an ensemble here never streams
        # (a decoupled step's model refuses the single-response call the ensemble makes).
        out.model_transaction_policy.decoupled = False
        return out  # no instances of its own: its steps run on their models' instances
    if not out.instance_group:
        group = out.instance_group.add()
        group.name = out.name
    for index, group in enumerate(out.instance_group):
        if not group.name:
            group.name = f"{out.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = (
                mc.ModelInstanceGroup.KIND_GPU
                if gpu_ids and all(g in gpu_ids for g in group.gpus)
                else mc.ModelInstanceGroup.KIND_CPU
            )
        if group.count < 1:
            cpu_default_two = group.kind == mc.ModelInstanceGroup.KIND_CPU and out.backend in (
                "onnxruntime",
                "tensorflow",
            )
            group.count = 2 if cpu_default_two else 1
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(gpu_ids)
    return out


def validate(
    cfg: mc.ModelConfig,
    *,
    dir_name: str | None = None,
    gpu_ids: Sequence[int] = (),
    instance_groups: bool = True,
) -> None:
    """Refuse a normalized config that Triton would refuse, with Triton's message.

    Triton checks most of the config when it polls the repository, but instance groups only
    when it loads the model (the two fail with different replies, see
    :meth:`reference_server.core.server.InferenceServer.load_model`); ``instance_groups=False`` runs
    just the poll-stage checks, :func:`validate_instance_groups` the rest.

    Raises:
        ModelConfigError: the first problem found.
    """
    name = cfg.name
    if dir_name is not None and name != dir_name:
        raise ModelConfigError(
            f"unexpected directory name '{dir_name}' for model '{name}', "
            "directory name must equal model name"
        )
    if not cfg.backend and not cfg.platform:
        raise ModelConfigError(
            f"unexpected platform type '' for {name}: set 'backend' (e.g. \"identity\", "
            '"simulated", "onnxruntime") or \'platform\''
        )
    if cfg.max_batch_size < 0:
        raise ModelConfigError(f"'max_batch_size' must be non-negative value for {name}")
    for tensor in [*cfg.input, *cfg.output]:
        kind = "input" if tensor in cfg.input else "output"
        if not tensor.name:
            raise ModelConfigError(f"model {kind} must specify 'name' for {name}")
        if tensor.data_type == mc.TYPE_INVALID:
            raise ModelConfigError(f"model {kind} '{tensor.name}' must specify 'data_type'")
        for dim in tensor.dims:
            if dim < -1 or dim == 0:
                raise ModelConfigError(
                    f"model {kind} '{tensor.name}' dimension must be integer >= 1, or -1 "
                    "to indicate a variable-size dimension"
                )
    if is_ensemble(cfg) or cfg.HasField("ensemble_scheduling"):
        check_graph(cfg)
        return
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg)
    if cfg.HasField("sequence_batching"):
        _validate_sequence_batching(cfg)
    if cfg.response_cache.enable and cfg.model_transaction_policy.decoupled:
        raise ModelConfigError(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )
    if instance_groups:
        validate_instance_groups(cfg, gpu_ids)


def validate_instance_groups(cfg: mc.ModelConfig, gpu_ids: Sequence[int] = ()) -> None:
    """Triton's load-stage instance-group checks (``ValidateInstanceGroup``).

    Raises:
        ModelConfigError: the first problem found.
    """
    name = cfg.name
    total = sum(max(1, group.count) for group in cfg.instance_group)
    if total > MAX_INSTANCES_PER_MODEL:
        counts = ", ".join(f"{g.name}: {g.count}" for g in cfg.instance_group)
        raise ModelConfigError(
            f"model {name} asks for {total} instances ({counts}); this server runs at most "
            f"{MAX_INSTANCES_PER_MODEL} instances per model: lower instance_group count"
        )
    for group in cfg.instance_group:
        if group.kind in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_MODEL):
            if group.gpus:
                kind_name = mc.ModelInstanceGroup.Kind.Name(group.kind)
                raise ModelConfigError(
                    f"instance group {group.name} of model {name} has kind {kind_name} "
                    "but specifies one or more GPUs"
                )
        elif group.kind == mc.ModelInstanceGroup.KIND_GPU:
            if not gpu_ids or not group.gpus:
                raise ModelConfigError(
                    f"instance group {group.name} of model {name} has kind KIND_GPU but no "
                    "GPUs are available"
                )
            for gpu in group.gpus:
                if gpu not in gpu_ids:
                    raise ModelConfigError(
                        f"instance group {group.name} of model {name} specifies invalid or "
                        f"unsupported gpu id {gpu}. GPUs with at least the minimum required "
                        "CUDA compute compatibility are: " + " ".join(str(g) for g in gpu_ids)
                    )


def _validate_dynamic_batching(cfg: mc.ModelConfig) -> None:
    name = cfg.name
    db = cfg.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise ModelConfigError(f"dynamic batching preferred size must be positive for {name}")
        if size > cfg.max_batch_size:
            raise ModelConfigError(
                f"dynamic batching preferred size must be <= max batch size for {name}"
            )
    if db.priority_levels != 0:
        if not 1 <= db.default_priority_level <= db.priority_levels:
            raise ModelConfigError(
                f"default priority level must be in range [1, {db.priority_levels}] for {name}"
            )
        for level in db.priority_queue_policy:
            if not 1 <= level <= db.priority_levels:
                raise ModelConfigError(
                    f"priority queue policy must have priority level in range "
                    f"[1, {db.priority_levels}] for {name}"
                )
    elif db.priority_queue_policy:
        raise ModelConfigError(
            f"priority queue policy must have priority level in range [1, 0] for {name}"
        )
    if db.preserve_ordering:
        if db.priority_levels > 1:
            raise ModelConfigError(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
            )
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        for policy in policies:
            if (
                policy.timeout_action == mc.ModelQueuePolicy.DELAY
                and policy.default_timeout_microseconds != 0
            ):
                raise ModelConfigError(
                    "Queue policy can not have DELAY as timeout action when "
                    f"'preserve_ordering' is true for {name}"
                )


_CONTROL = mc.ModelSequenceBatching.Control
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)


def _validate_sequence_batching(cfg: mc.ModelConfig) -> None:
    """``ValidateModelConfig``'s sequence-batching checks, in Triton's order and words."""
    name = cfg.name
    if cfg.response_cache.enable:
        raise ModelConfigError(
            f"Response Cache does not currently support model {name} with sequence "
            "batching scheduler. Please disable the response cache."
        )
    sb = cfg.sequence_batching
    for kind in (
        _CONTROL.CONTROL_SEQUENCE_START,
        _CONTROL.CONTROL_SEQUENCE_END,
        _CONTROL.CONTROL_SEQUENCE_READY,
        _CONTROL.CONTROL_SEQUENCE_CORRID,
    ):
        _check_control(sb, name, kind)
    for control_input in sb.control_input:
        for control in control_input.control:
            if (
                control.kind == _CONTROL.CONTROL_SEQUENCE_CORRID
                and control.data_type not in _CORRID_TYPES
            ):
                raise ModelConfigError(
                    f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. "
                    "Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 "
                    "and TYPE_STRING"
                )
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                raise ModelConfigError(
                    f"sequence batching preferred batch size must be positive for {name}"
                )
            if size > cfg.max_batch_size:
                raise ModelConfigError(
                    f"sequence batching preferred batch size must be <= max batch size for {name}"
                )
    if sb.HasField("direct"):
        utilization = sb.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise ModelConfigError(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for " + name
            )


def _check_control(sb: mc.ModelSequenceBatching, name: str, kind: int) -> None:
    """``Get{Boolean,Typed}SequenceControlProperties`` for one control kind."""
    kind_name = _CONTROL.Kind.Name(kind)
    typed = kind == _CONTROL.CONTROL_SEQUENCE_CORRID
    seen_tensors: set[str] = set()
    seen = False
    for control_input in sb.control_input:
        if not control_input.name:
            raise ModelConfigError(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise ModelConfigError(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {name}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if seen:
                raise ModelConfigError(
                    f"sequence batching specifies multiple {kind_name} tensors for {name}"
                )
            seen = True
            lists = {
                "int32_false_true": len(control.int32_false_true),
                "fp32_false_true": len(control.fp32_false_true),
                "bool_false_true": len(control.bool_false_true),
            }
            given = [k for k, n in lists.items() if n]
            if typed:
                if given:
                    raise ModelConfigError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {name}"
                    )
                continue
            if not given:
                raise ModelConfigError(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {name}"
                )
            if len(given) > 1:
                raise ModelConfigError(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {name}"
                )
            if lists[given[0]] != 2:
                raise ModelConfigError(
                    f"sequence batching control '{given[0]}' must have exactly 2 entries for "
                    f"{kind_name} for {name}"
                )


def parameter(cfg: mc.ModelConfig, key: str, default: str = "") -> str:
    """Return the string value of config ``parameters[key]`` or ``default``."""
    if key in cfg.parameters:
        return str(cfg.parameters[key].string_value)
    return default
