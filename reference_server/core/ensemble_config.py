"""An ensemble's config as Triton checks it: ``platform: "ensemble"`` with ``ensemble_scheduling``
steps, refused with Triton's messages by :func:`check_graph` when the repository is polled (the
tensors' data flow, ``ValidateEnsembleSchedulingConfig``) and by :func:`check_steps` when the
ensemble is loaded against its loaded composing models (mappings, data types, shapes, batch
sizes, ``ValidateEnsembleConfig``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.errors import Code, ModelConfigError, ServerError

PLATFORM = "ensemble"


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == PLATFORM


def composing_models(config: mc.ModelConfig) -> list[str]:
    """The models the ensemble's steps call, in step order, each once."""
    return list(dict.fromkeys(s.model_name for s in config.ensemble_scheduling.step))


# ---------------------------------------------------------------------------- poll-stage checks


@dataclass(eq=False)
class _Node:
    """An ensemble tensor in the data-flow graph."""

    name: str
    written: bool  # some step's output_map writes it
    ready: bool = False
    before: list[_Node] = field(default_factory=list)
    after: list[_Node] = field(default_factory=list)


def check_graph(cfg: mc.ModelConfig) -> None:
    """Refuse an ensemble whose steps cannot carry its inputs to its outputs.

    Raises:
        ModelConfigError: Triton's message for the first problem.
    """
    name = cfg.name
    if not is_ensemble(cfg):
        raise ModelConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {PLATFORM}"
        )
    if cfg.instance_group:
        raise ModelConfigError(f"instance group should not be specified for ensemble '{name}'")
    if cfg.HasField("optimization"):
        raise ModelConfigError(f"optimization should not be specified for ensemble '{name}'")
    if cfg.model_warmup:
        raise ModelConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    steps = cfg.ensemble_scheduling.step
    if not steps:
        raise ModelConfigError(f"must specify 'step' for ensemble '{name}'")
    nodes: dict[str, _Node] = {}
    for index, step in enumerate(steps):
        for what, present in (
            ("model_name", step.model_name),
            ("input_map", step.input_map),
            ("output_map", step.output_map),
        ):
            if not present:
                raise ModelConfigError(
                    f"must specify '{what}' in step {index} of ensemble '{name}'"
                )
        written = []
        for tensor in step.output_map.values():
            node = nodes.get(tensor)
            if node is not None and node.written:
                raise ModelConfigError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            if node is None:
                node = nodes[tensor] = _Node(tensor, written=True)
            node.written = True
            written.append(node)
        for model_input, tensor in step.input_map.items():
            # A map cannot hold a key twice: the protobuf text parser already keeps the last.
            source = nodes.setdefault(tensor, _Node(tensor, written=False))
            del model_input
            for out in written:
                out.before.append(source)
                source.after.append(out)
    queue = []
    for tensor in cfg.input:
        node = nodes.get(tensor.name)
        if node is None:
            raise ModelConfigError(
                f"ensemble input '{tensor.name}' for ensemble {name}' is not used"
            )
        node.ready = True
        queue.append(node)
    while queue:
        node = queue.pop(0)
        for nxt in node.after:
            if not nxt.ready and all(b.ready for b in nxt.before):
                nxt.ready = True
                queue.append(nxt)
    outputs = set()
    for tensor in cfg.output:
        node = nodes.get(tensor.name)
        if node is None:
            raise ModelConfigError(
                f"ensemble output '{tensor.name}' for ensemble {name}' is not used"
            )
        if not node.ready:
            message = f"output '{tensor.name}' for ensemble '{name}' is not written"
            source, seen, before = node, set(), node.before
            while before:
                upstream = next((b for b in before if not b.ready and b.name not in seen), None)
                if upstream is None:
                    break
                seen.add(upstream.name)
                source, before = upstream, upstream.before
            if source is not node:
                message += (
                    f": at least one of its depending tensors, '{source.name}', is not connected"
                )
            raise ModelConfigError(message)
        outputs.add(tensor.name)
    for tensor, node in nodes.items():
        if tensor not in outputs and (not node.ready or not node.after):
            raise ModelConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


# ---------------------------------------------------------------------------- load-stage checks


@dataclass(frozen=True)
class _Tensor:
    """An ensemble tensor's type and shape as one model declares it."""

    model: str
    data_type: int
    dims: tuple[int, ...]
    batching: bool

    @property
    def full(self) -> tuple[int, ...]:
        return ((-1,) if self.batching else ()) + self.dims


def _same_dims(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _consistent(seen: _Tensor, new: _Tensor, prefix: str) -> None:
    if seen.data_type != new.data_type:
        raise ServerError(
            f"{prefix}inconsistent data type: {mc.DataType.Name(seen.data_type)} is inferred "
            f"from model {seen.model} while {mc.DataType.Name(new.data_type)} is inferred from "
            f"model {new.model}",
            Code.INVALID_ARG,
        )
    if not _same_dims(seen.dims, new.dims) and not _same_dims(seen.full, new.full):
        shown = ("[" + ",".join(str(d) for d in t.full) + "]" for t in (seen, new))
        a, b = shown
        raise ServerError(
            f"{prefix}inconsistent shape: {a} is inferred from model {seen.model} while {b} is "
            f"inferred from model {new.model}",
            Code.INVALID_ARG,
        )


def check_steps(cfg: mc.ModelConfig, composing: Mapping[str, mc.ModelConfig]) -> None:
    """Refuse an ensemble that does not fit its loaded composing models (``composing``: each
    step's model's config).

    Raises:
        ServerError: INVALID_ARG with Triton's message for the first problem.
    """
    ens = cfg.name
    batching = cfg.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for t in [*cfg.input, *cfg.output]:
        dims = tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)
        tensors[t.name] = _Tensor(ens, t.data_type, dims, batching)
    for step in cfg.ensemble_scheduling.step:
        model = composing[step.model_name]
        if 0 < model.max_batch_size < cfg.max_batch_size:
            raise ServerError(
                f"ensemble {ens} allows maximum batch size {cfg.max_batch_size}, but it "
                f"contains model {step.model_name} which only allows maximum batch size to be "
                f"{model.max_batch_size}",
                Code.INVALID_ARG,
            )
        step_batching = model.max_batch_size > 0
        inputs = {i.name: i for i in model.input}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                raise ServerError(
                    f"in ensemble {ens}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {model_input} in model {step.model_name}",
                    Code.INVALID_ARG,
                )
        for spec in model.input:
            tensor = step.input_map.get(spec.name)
            if tensor is None:
                if spec.optional:
                    continue
                raise ServerError(
                    f"in ensemble {ens}, input {spec.name} in model {step.model_name} is not "
                    "mapped to any ensemble tensors",
                    Code.INVALID_ARG,
                )
            declared = _Tensor(step.model_name, spec.data_type, tuple(spec.dims), step_batching)
            seen = tensors.setdefault(tensor, declared)
            _consistent(seen, declared, f"in ensemble {ens}, ensemble tensor {tensor}: ")
        outputs = {o.name: o for o in model.output}
        for model_output, tensor in step.output_map.items():
            spec = outputs.get(model_output)
            if spec is None:
                raise ServerError(
                    f"in ensemble {ens}, ensemble tensor {tensor} is mapped from non-existing "
                    f"output {model_output} in model {step.model_name}",
                    Code.INVALID_ARG,
                )
            declared = _Tensor(step.model_name, spec.data_type, tuple(spec.dims), step_batching)
            seen = tensors.setdefault(tensor, declared)
            _consistent(seen, declared, f"in ensemble {ens}, ensemble tensor {tensor}: ")
