"""``tinyllm``: the bundled generative model, served by the reference engine on a simulated device.

The counterpart of ``resnet50`` for generative models: a model repository laid out as one for
Triton's vLLM backend (``backend: "vllm"``, decoupled, ``max_batch_size: 0``, the backend's
inputs and ``text_output``), with the engine settings in ``1/model.json``, run by
:mod:`reference_server.backends.generative` with the bundled ``tinyllm_sim`` profile (a
7B-class decoder on a 24 GiB card; synthetic numbers, see the profile's provenance). There are
no weights: the engine simulates the device, so it runs with ``--device sim`` only.

``python -m reference_server.zoo.tinyllm MODEL ROOT DEVICE`` writes it from a command line, as
``reference_server.zoo.resnet50`` does for ResNet-50.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.config import config_to_text

MODEL_NAME = "tinyllm"

#: The bundled engine settings (vLLM's names; ``1/model.json``).
ENGINE_SETTINGS: dict[str, Any] = {
    "model": MODEL_NAME,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 2048,
    "enable_chunked_prefill": True,
    "gpu_memory_utilization": 0.9,
    "block_size": 16,
}


def tinyllm_config() -> mc.ModelConfig:
    """The bundled config: the interface of Triton's vLLM backend on the simulated device."""
    cfg = mc.ModelConfig(name=MODEL_NAME, backend="vllm", max_batch_size=0)
    cfg.model_transaction_policy.decoupled = True
    cfg.parameters["profile"].string_value = "tinyllm_sim"
    cfg.parameters["sim_device"].string_value = "sim-gpu0"
    cfg.input.add(name="text_input", data_type=mc.TYPE_STRING, dims=[1])
    for name, dtype in (
        ("stream", mc.TYPE_BOOL),
        ("sampling_parameters", mc.TYPE_STRING),
        ("exclude_input_in_output", mc.TYPE_BOOL),
    ):
        cfg.input.add(name=name, data_type=dtype, dims=[1], optional=True)
    cfg.output.add(name="text_output", data_type=mc.TYPE_STRING, dims=[-1])
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_MODEL)
    return cfg


def make_repository(root: Path, device: str = "sim", engine: dict[str, Any] | None = None) -> Path:
    """Write ``root/tinyllm`` (config.pbtxt and ``1/model.json``) and return ``root``.

    Raises:
        ValueError: ``device`` is not ``sim`` (the model exists only as a simulation).
    """
    if device != "sim":
        raise ValueError(
            f"the bundled model {MODEL_NAME!r} is a simulation: run it with --device sim "
            f"(got {device!r})"
        )
    model_dir = Path(root) / MODEL_NAME
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_to_text(tinyllm_config()), encoding="utf-8")
    settings = {**ENGINE_SETTINGS, **(engine or {})}
    (model_dir / "1" / "model.json").write_text(json.dumps(settings, indent=2) + "\n")
    return Path(root)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reference_server.zoo.tinyllm MODEL ROOT DEVICE``: write the repository."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: python -m reference_server.zoo.tinyllm MODEL ROOT DEVICE", file=sys.stderr)
        return 2
    model, root, device = args
    if model != MODEL_NAME:
        print(f"not a bundled model: {model}", file=sys.stderr)
        return 2
    try:
        make_repository(Path(root), device)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
