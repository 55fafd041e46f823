"""ResNet-50 v1.5 built in code as ONNX, and model repositories that serve it.

The graph is the standard ResNet-50 v1.5 (stride 2 in the 3x3 convolution of each downsampling
bottleneck) with batch normalisation folded into the convolutions, and seeded random weights:
no download is possible or needed, since compute cost does not depend on weight values. The
file is cached under ``$PERFSWEEP_CACHE`` (default ``~/.cache/perfsweep``) after the first
build.

:func:`make_repository` writes a model repository for ``resnet50`` that runs the graph with the
onnxruntime backend (``device`` cpu/cuda/auto) or a simulated device (``device="sim"``). The
bundled config is the sweep's baseline: no dynamic batching, one instance, max_batch_size 32.

``python -m reference_server.zoo.resnet50 MODEL ROOT DEVICE`` does the same from a command line
(:func:`main`): perfsweep's managed server prepares its repository that way, in a child process,
so the analyzer never imports onnx.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.config import config_to_text

MODEL_NAME = "resnet50"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
NUM_CLASSES = 1000
#: Blocks per stage and bottleneck widths of ResNet-50.
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
EXPANSION = 4
_OPSET = 17


def cache_dir() -> Path:
    """Where built models are cached (``$PERFSWEEP_CACHE`` or ``~/.cache/perfsweep``)."""
    env = os.environ.get("PERFSWEEP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "perfsweep"


class _GraphBuilder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def conv(
        self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, gain: float = 1.0
    ) -> str:
        # He-normal weights keep activations in range through 50 layers; ``gain`` damps the
        # last conv of each residual branch so the sums do not grow without bound.
        name = self._name("conv")
        std = gain * np.sqrt(2.0 / (c_in * k * k))
        w = (self.rng.standard_normal((c_out, c_in, k, k), dtype=np.float32) * std).astype(
            np.float32
        )
        b = np.zeros(c_out, dtype=np.float32)  # folded batch-norm shift
        self.inits.append(numpy_helper.from_array(w, f"{name}_w"))
        self.inits.append(numpy_helper.from_array(b, f"{name}_b"))
        out = f"{name}_y"
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}_w", f"{name}_b"],
                [out],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[k // 2] * 4,
            )
        )
        return out

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def bottleneck(self, x: str, c_in: int, width: int, stride: int) -> str:
        c_out = width * EXPANSION
        y = self.op("Relu", [self.conv(x, c_in, width, 1)])
        y = self.op("Relu", [self.conv(y, width, width, 3, stride)])  # v1.5: stride here
        y = self.conv(y, width, c_out, 1, gain=0.2)
        shortcut = x
        if stride != 1 or c_in != c_out:
            shortcut = self.conv(x, c_in, c_out, 1, stride)
        return self.op("Relu", [self.op("Add", [y, shortcut])])


def build_resnet50(seed: int = 0) -> onnx.ModelProto:
    """Build the ResNet-50 v1.5 graph with seeded random weights.

    Input ``input`` FP32 ``[batch, 3, 224, 224]``, output ``output`` FP32 ``[batch, 1000]``.
    """
    g = _GraphBuilder(seed)
    x = g.op("Relu", [g.conv(INPUT_NAME, 3, 64, 7, 2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, (blocks, width) in enumerate(STAGES):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = g.bottleneck(x, c_in, width, stride)
            c_in = width * EXPANSION
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    fc_w = (g.rng.standard_normal((c_in, NUM_CLASSES), dtype=np.float32) / np.sqrt(c_in)).astype(
        np.float32
    )
    g.inits.append(numpy_helper.from_array(fc_w, "fc_w"))
    g.inits.append(numpy_helper.from_array(np.zeros(NUM_CLASSES, np.float32), "fc_b"))
    g.nodes.append(helper.make_node("Gemm", [x, "fc_w", "fc_b"], [OUTPUT_NAME]))
    graph = helper.make_graph(
        g.nodes,
        "resnet50_v1_5",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", NUM_CLASSES])],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="perfsweep"
    )
    model.ir_version = 8
    return model


def resnet50_onnx(seed: int = 0, cache: Path | None = None) -> Path:
    """Path of the cached ResNet-50 ONNX file, building it on first use (atomic write)."""
    directory = cache or cache_dir()
    path = directory / f"resnet50_v1.5_seed{seed}.onnx"
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    model = build_resnet50(seed)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".onnx.tmp")
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def baseline_config(device: str = "auto", max_batch_size: int = 32) -> mc.ModelConfig:
    """The bundled ``resnet50`` config: no dynamic batching, one instance (the sweep's baseline).

    Args:
        device: ``cpu``, ``cuda``, ``auto`` (onnxruntime backend) or ``sim`` (simulated device
            with the bundled ``resnet50_sim`` profile).
        max_batch_size: Largest batch the model accepts.
    """
    cfg = mc.ModelConfig(name=MODEL_NAME, max_batch_size=max_batch_size)
    if device == "sim":
        cfg.backend = "simulated"
        cfg.parameters["profile"].string_value = "resnet50_sim"
        cfg.parameters["sim_device"].string_value = "sim-gpu0"
        kind = mc.ModelInstanceGroup.KIND_CPU
    elif device in ("cpu", "cuda", "auto"):
        cfg.backend = "onnxruntime"
        cfg.platform = "onnxruntime_onnx"
        cfg.parameters["device"].string_value = device
        kind = {
            "cpu": mc.ModelInstanceGroup.KIND_CPU,
            "cuda": mc.ModelInstanceGroup.KIND_GPU,
            "auto": mc.ModelInstanceGroup.KIND_AUTO,
        }[device]
    else:
        raise ValueError(f"device must be cpu, cuda, auto or sim, not {device!r}")
    inp = cfg.input.add(name=INPUT_NAME, data_type=mc.TYPE_FP32)
    inp.dims.extend([3, 224, 224])
    out = cfg.output.add(name=OUTPUT_NAME, data_type=mc.TYPE_FP32)
    out.dims.append(NUM_CLASSES)
    cfg.instance_group.add(count=1, kind=kind)
    return cfg


def make_repository(
    root: Path, device: str = "auto", max_batch_size: int = 32, seed: int = 0
) -> Path:
    """Write a model repository holding ``resnet50`` and return its root.

    The ONNX file is linked from the cache (copied where links are not possible); a simulated
    model needs no file, only an empty version directory.
    """
    model_dir = Path(root) / MODEL_NAME
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    cfg = baseline_config(device, max_batch_size)
    (model_dir / "config.pbtxt").write_text(config_to_text(cfg), encoding="utf-8")
    if device != "sim":
        target = version_dir / "model.onnx"
        source = resnet50_onnx(seed)
        if target.exists() or target.is_symlink():
            target.unlink()
        try:
            target.symlink_to(source)
        except OSError:
            target.write_bytes(source.read_bytes())
    return Path(root)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reference_server.zoo.resnet50 MODEL ROOT DEVICE``: write the repository.

    Returns:
        0 when the repository was written; 2 when ``MODEL`` is not a bundled model or the
        arguments are wrong (the reason is the last line on stderr).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: python -m reference_server.zoo.resnet50 MODEL ROOT DEVICE", file=sys.stderr)
        return 2
    model, root, device = args
    if model != MODEL_NAME:
        print(f"not a bundled model: {model}", file=sys.stderr)
        return 2
    make_repository(Path(root), device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
