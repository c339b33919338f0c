"""The model's side of a bundle: its inputs and outputs, int8 weights, samples and parity.

onnx, onnxruntime and numpy are imported by the functions that need them (build and verify
only). Parity numbers are computed here for both ``build`` (in process) and ``verify`` (from
the answers of the installed bundle).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["Parity", "TensorInfo", "compare", "describe", "float_weight_bytes", "make_samples",
           "mapped_output", "quantize_weights", "run_onnx"]

#: Weights below this many values stay float32 (biases, small layers: no size to win).
_MIN_QUANTIZED_VALUES = 1024
_ORT_TYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
              "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(int32)": "int32",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool",
              "tensor(string)": "string"}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int | None, ...] | None  # None: unknown rank; a None dim: symbolic (batch)
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype,
                "shape": list(self.shape) if self.shape is not None else None}


def _session(model: bytes, *, int8: bool = False) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if int8:  # as the bundle's runtime does: fold the dequantization once, compute in float
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def describe(model: bytes) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The model's inputs and outputs as onnxruntime sees them."""
    session = _session(model)

    def info(arg: Any) -> TensorInfo:
        shape = None if arg.shape is None else tuple(
            d if isinstance(d, int) and d >= 0 else None for d in arg.shape)
        return TensorInfo(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type))

    return [info(a) for a in session.get_inputs()], [info(a) for a in session.get_outputs()]


def run_onnx(model: bytes, feeds: Mapping[str, np.ndarray], *,
             int8: bool = False) -> dict[str, np.ndarray]:
    import numpy as np

    session = _session(model, int8=int8)
    names = [o.name for o in session.get_outputs()]
    batch = session.get_inputs()[0].shape[0] if session.get_inputs()[0].shape else None
    count = len(next(iter(feeds.values())))
    if not isinstance(batch, int) or batch == count or count % batch:
        return dict(zip(names, session.run(names, dict(feeds)), strict=True))
    # A model exported with a fixed batch size: run it in slices, as the bundle's runtime does.
    parts = [session.run(names, {k: v[i:i + batch] for k, v in feeds.items()})
             for i in range(0, count, batch)]
    return {n: np.concatenate([p[j] for p in parts]) for j, n in enumerate(names)}


# --- int8 weights -------------------------------------------------------------------------

def _weight_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Initializers that are the weight of a Conv/Gemm/MatMul, with their output-channel axis.

    A weight used by several nodes that disagree on the axis is left alone.
    """
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input}  # old models list initializers there
    axes: dict[str, int] = {}
    conflicting: set[str] = set()
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in inits or node.input[1] in graph_inputs:
            continue
        if node.op_type == "Conv":
            axis = 0  # [M, C/group, kH, kW]
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 0 if trans_b else 1  # B is [N, K] with transB (torch's Linear), else [K, N]
        elif node.op_type == "MatMul":
            axis = -1  # [..., K, N]: resolved against the weight's rank
        else:
            continue
        name = node.input[1]
        if axes.setdefault(name, axis) != axis:
            conflicting.add(name)
    for node in model.graph.node:  # used elsewhere in another position: keep it float
        for position, name in enumerate(node.input):
            if name in axes and (position != 1 or node.op_type not in ("Conv", "Gemm", "MatMul")):
                conflicting.add(name)
    return {k: v for k, v in axes.items() if k not in conflicting}


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def float_weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of float32 Conv/Gemm/MatMul weights: what int8 storage would shrink fourfold."""
    from onnx import TensorProto

    axes = _weight_axes(model)
    return sum(4 * math.prod(i.dims) for i in model.graph.initializer
               if i.name in axes and i.data_type == TensorProto.FLOAT
               and math.prod(i.dims) >= _MIN_QUANTIZED_VALUES)


def quantize_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int, str | None]:
    """Store Conv/Gemm/MatMul weights as int8, one symmetric scale per output channel.

    Each weight becomes an int8 initializer, a float32 scale per channel and a
    ``DequantizeLinear`` node that restores the float tensor under its old name, so the rest
    of the graph is untouched and compute stays float32 (the bundle's runtime has onnxruntime
    fold the dequantization once, at load). Returns the new model, the number of weights
    converted, and why nothing was converted when that is the case.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    opset = _opset(model)
    if opset < 13:  # per-axis DequantizeLinear arrived in opset 13
        return model, 0, (f"the model's opset is {opset}; per-channel int8 weights need "
                          "opset 13 or later")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    axes = _weight_axes(out)
    nodes, converted = [], 0
    for init in list(out.graph.initializer):
        if (init.name not in axes or init.data_type != TensorProto.FLOAT
                or math.prod(init.dims) < _MIN_QUANTIZED_VALUES):
            continue
        if len(init.dims) < 2:
            continue
        weight = numpy_helper.to_array(init)
        axis = axes[init.name] % weight.ndim
        scale = np.abs(weight).max(axis=tuple(d for d in range(weight.ndim) if d != axis))
        scale = np.where(scale > 0, scale / 127.0, 1.0).astype(np.float32)
        shape = [1] * weight.ndim
        shape[axis] = -1
        q = np.clip(np.rint(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
        out.graph.initializer.remove(init)
        base = init.name
        out.graph.initializer.extend([
            numpy_helper.from_array(q, f"{base}.int8"),
            numpy_helper.from_array(scale, f"{base}.scale"),
            numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{base}.zero_point")])
        nodes.append(helper.make_node("DequantizeLinear",
                                      [f"{base}.int8", f"{base}.scale", f"{base}.zero_point"],
                                      [base], name=f"{base}.dequantize", axis=axis))
        converted += 1
    if not converted:
        return model, 0, "no Conv/Gemm/MatMul weight of 1024 values or more"
    for position, node in enumerate(nodes):  # before every consumer: topological order holds
        out.graph.node.insert(position, node)
    onnx.checker.check_model(out)
    return out, converted, None


# --- samples and parity -------------------------------------------------------------------

def make_samples(inputs: list[TensorInfo], count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for the parity check: uniform [0, 1) floats, small non-negative integers.

    Symbolic dimensions other than the batch are taken as 1; a model whose inputs cannot be
    guessed needs real samples (``samples=``).
    """
    import numpy as np

    from shoal.errors import InvalidArgumentError

    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        if spec.shape is None:
            raise InvalidArgumentError(f"input {spec.name!r} has no known shape; pass real "
                                       "inputs with samples=FILE.npy (--samples)")
        shape = (count, *(d or 1 for d in spec.shape[1:]))
        if spec.dtype.startswith("float"):
            feeds[spec.name] = rng.random(shape).astype(spec.dtype)
        elif spec.dtype in ("int64", "int32", "int8", "uint8"):
            feeds[spec.name] = rng.integers(0, 10, shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            feeds[spec.name] = rng.random(shape) < 0.5
        else:
            raise InvalidArgumentError(f"input {spec.name!r} is {spec.dtype}; pass real inputs "
                                       "with samples=FILE.npy (--samples)")
    return feeds


@dataclass(frozen=True, slots=True)
class Parity:
    """How far one set of outputs is from a reference, on the same inputs."""

    samples: int
    agreement: float | None    # share of equal predictions (argmax, or labels)
    max_abs_diff: float | None  # over the float outputs both sides have

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "agreement": self.agreement,
                "max_abs_diff": self.max_abs_diff}

    def close(self, *, rtol: float = 1e-4, atol: float = 1e-5, scale: float = 1.0) -> bool:
        return self.max_abs_diff is None or self.max_abs_diff <= atol + rtol * scale


def mapped_output(outputs: list[TensorInfo], output_map: str) -> str | None:
    """The output the answer is made of: the first 2-D one for argmax, else the first."""
    if output_map == "argmax":
        return next((o.name for o in outputs if o.shape is not None and len(o.shape) == 2),
                    None)
    return outputs[0].name if outputs else None


def compare(reference: Mapping[str, Any], got: Mapping[str, Any], *, mapped: str,
            argmax: bool) -> Parity:
    """Parity of *got* against *reference*: float outputs both have, and the answer."""
    import numpy as np

    diffs = []
    for name in reference.keys() & got.keys():
        a, b = np.asarray(reference[name]), np.asarray(got[name])
        if a.dtype.kind == "f" and a.shape == b.shape:
            diffs.append(float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0)))
    agreement = None
    if mapped in reference and mapped in got:
        want, have = np.asarray(reference[mapped]), np.asarray(got[mapped])
        if argmax:
            want, have = want.argmax(axis=-1), have.argmax(axis=-1)
        if want.shape == have.shape:
            agreement = float(np.mean(want == have)) if want.size else 1.0
    count = len(np.asarray(next(iter(reference.values())))) if reference else 0
    return Parity(count, agreement, max(diffs) if diffs else None)
