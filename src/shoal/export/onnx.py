"""ONNX export of torch modules (``export``) and scikit-learn estimators (``export_sklearn``),
and ``verify``: onnxruntime's answers against a reference.

torch, onnx, onnxruntime and skl2onnx are imported inside the functions, so importing this
module costs nothing. Every export is atomic: the file appears complete and checked, or not at
all.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.extras import install_hint, needs_extra, require
from shoal.errors import InvalidArgumentError, ModelExportError, ModelVerificationError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["OutputComparison", "VerificationReport", "export", "export_sklearn", "verify"]

_BATCH_AXIS = "batch"


@needs_extra("torch", "shoal.export.onnx.export")
def export(model: Any, example_input: Any, path: str | os.PathLike[str], *,
           dynamic_batch: bool = True, opset: int | None = None,
           input_names: Sequence[str] = ("input",), output_names: Sequence[str] = ("output",),
           dynamo: bool | None = None) -> Path:
    """Export a torch module to ONNX at *path* and check the result with ``onnx.checker``.

    *example_input* is a tensor or a tuple of tensors (one per model input). With
    *dynamic_batch* the first axis of every input and output is symbolic (``batch``), so a
    server can run any number of rows at once. *dynamo* picks torch's exporter: ``None`` (the
    default) uses the TorchScript exporter where this torch still has it (fast, no extra
    dependency) and the ``torch.export`` one (needs ``onnxscript``) otherwise.

    Example::

        export(net, torch.randn(1, 1, 28, 28), "model/model.onnx")
    """
    import torch

    inputs = _as_tuple(example_input)
    names_in = _input_names(input_names, len(inputs))
    target = Path(path)
    use_dynamo = (not _has_torchscript_exporter()) if dynamo is None else dynamo
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with _atomic_target(target) as tmp, torch.no_grad():
            if use_dynamo:
                _export_dynamo(model, inputs, tmp, names_in, list(output_names), opset,
                               dynamic_batch)
            else:
                _export_torchscript(model, inputs, tmp, names_in, list(output_names), opset,
                                    dynamic_batch)
            _check(tmp, dynamic_batch=dynamic_batch)
    finally:
        if was_training:
            model.train()
    return target


@needs_extra("sklearn", "shoal.export.onnx.export_sklearn")
def export_sklearn(estimator: Any, n_features: int, path: str | os.PathLike[str], *,
                   opset: int | None = None, input_name: str = "input") -> Path:
    """Export a fitted scikit-learn estimator or pipeline to ONNX through skl2onnx.

    The input is ``float32 [batch, n_features]``. Classifiers answer with plain arrays
    (``label``, ``probabilities``): ZipMap, which turns probabilities into a list of dicts, is
    off, so a server can batch and split the answers like any other tensor.
    """
    if not isinstance(n_features, int) or isinstance(n_features, bool) or n_features < 1:
        raise InvalidArgumentError(f"n_features must be a positive int, got {n_features!r}")
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.base import is_classifier

    target = Path(path)
    options = {"zipmap": False} if is_classifier(estimator) else None
    with _atomic_target(target) as tmp:
        try:
            proto = convert_sklearn(estimator, initial_types=[(input_name, FloatTensorType(
                [None, n_features]))], target_opset=opset, options=options)
        except Exception as e:  # skl2onnx raises bare RuntimeError/TypeError/NameError
            raise ModelExportError(f"skl2onnx could not convert {type(estimator).__name__}: "
                                   f"{type(e).__name__}: {e}") from e
        tmp.write_bytes(proto.SerializeToString())
        _check(tmp, dynamic_batch=True)
    return target


# --- verify ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OutputComparison:
    """How one ONNX output compares with the reference's."""

    name: str
    shape: tuple[int, ...]
    expected_shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    mismatched: int
    ok: bool


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """onnxruntime against a reference: the worst errors over all outputs, and each output."""

    max_abs_error: float
    max_rel_error: float
    ok: bool
    outputs: tuple[OutputComparison, ...]
    rtol: float
    atol: float

    def __str__(self) -> str:
        lines = [f"{'ok' if self.ok else 'MISMATCH'}: max abs error {self.max_abs_error:.3g}, "
                 f"max rel error {self.max_rel_error:.3g} (rtol={self.rtol}, atol={self.atol})"]
        for o in self.outputs:
            if o.shape != o.expected_shape:
                lines.append(f"  {o.name}: shape {o.shape} but the reference has "
                             f"{o.expected_shape}")
            else:
                lines.append(f"  {o.name} {o.shape}: max abs {o.max_abs_error:.3g}, max rel "
                             f"{o.max_rel_error:.3g}, {o.mismatched} element(s) out of "
                             f"tolerance")
        return "\n".join(lines)


def verify(onnx_path: str | os.PathLike[str], reference: Any, inputs: Any, *,
           rtol: float = 1e-3, atol: float = 1e-5, strict: bool = False) -> VerificationReport:
    """Run *onnx_path* in onnxruntime on *inputs* and compare with *reference*.

    *reference* is a torch module, any callable taking the input arrays, or the expected
    outputs themselves (an array, a sequence of arrays, or a dict by output name). *inputs* is
    an array or tensor, a sequence of them (model input order), or a dict by input name. An
    element is within tolerance when ``|onnx - ref| <= atol + rtol * |ref|``; integer outputs
    (class labels) must be equal. With *strict*, a mismatch raises ``ModelVerificationError``.

    Example::

        report = verify("model.onnx", net, torch.randn(8, 1, 28, 28))
        assert report.ok, report
    """
    framework = type(reference).__module__.partition(".")[0]
    require("sklearn" if framework == "sklearn" else "torch", "shoal.export.onnx.verify",
            "numpy", "onnxruntime")
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    in_names = [i.name for i in session.get_inputs()]
    out_names = [o.name for o in session.get_outputs()]
    arrays = _input_arrays(inputs, in_names)
    actual = session.run(None, dict(zip(in_names, arrays, strict=True)))
    expected = _reference_outputs(reference, arrays, out_names)
    if len(expected) != len(actual):
        raise InvalidArgumentError(f"the reference gave {len(expected)} output(s) but "
                                   f"{onnx_path} has {len(actual)}: {out_names}")
    comparisons = tuple(_compare(name, np.asarray(a), np.asarray(e), rtol, atol)
                        for name, a, e in zip(out_names, actual, expected, strict=True))
    report = VerificationReport(
        max_abs_error=max((c.max_abs_error for c in comparisons), default=0.0),
        max_rel_error=max((c.max_rel_error for c in comparisons), default=0.0),
        ok=all(c.ok for c in comparisons), outputs=comparisons, rtol=rtol, atol=atol)
    if strict and not report.ok:
        raise ModelVerificationError(f"{onnx_path} does not match its reference:\n{report}",
                                     path=str(onnx_path))
    return report


def _compare(name: str, actual: Any, expected: Any, rtol: float,
             atol: float) -> OutputComparison:
    import numpy as np

    if actual.shape != expected.shape:
        return OutputComparison(name, tuple(actual.shape), tuple(expected.shape),
                                float("inf"), float("inf"), int(actual.size), False)
    if actual.size == 0:
        return OutputComparison(name, actual.shape, expected.shape, 0.0, 0.0, 0, True)
    if not (np.issubdtype(actual.dtype, np.number) and np.issubdtype(expected.dtype, np.number)):
        bad = int(np.count_nonzero(actual != expected))
        return OutputComparison(name, actual.shape, expected.shape, float(bad > 0),
                                float(bad > 0), bad, bad == 0)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    diff = np.abs(a - e)
    exact = np.issubdtype(actual.dtype, np.integer) and np.issubdtype(expected.dtype, np.integer)
    allowed = 0.0 if exact else atol + rtol * np.abs(e)
    bad = int(np.count_nonzero(~(diff <= allowed)))  # NaN counts as a mismatch
    rel = diff / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
    return OutputComparison(name, actual.shape, expected.shape, float(np.nanmax(diff)),
                            float(np.nanmax(rel)), bad, bad == 0)


def _input_arrays(inputs: Any, names: list[str]) -> list[Any]:
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InvalidArgumentError(f"inputs lack {missing}; the model's inputs are {names}")
        return [_to_numpy(inputs[n]) for n in names]
    arrays = [_to_numpy(x) for x in _as_tuple(inputs)]
    if len(arrays) != len(names):
        raise InvalidArgumentError(f"{len(arrays)} input(s) given but the model takes "
                                   f"{len(names)}: {names}")
    return arrays


def _reference_outputs(reference: Any, arrays: list[Any], out_names: list[str]) -> list[Any]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(reference, torch.nn.Module):
        was_training = reference.training
        reference.eval()
        try:
            with torch.no_grad():
                result = reference(*[torch.from_numpy(a) for a in arrays])
        finally:
            reference.train(was_training)
    elif callable(reference):
        result = reference(*arrays)
    else:
        result = reference
    if isinstance(result, Mapping):
        missing = [n for n in out_names if n not in result]
        if missing:
            raise InvalidArgumentError(f"the reference lacks outputs {missing}; the model's "
                                       f"outputs are {out_names}")
        return [_to_numpy(result[n]) for n in out_names]
    return [_to_numpy(x) for x in _as_tuple(result)]


def _to_numpy(x: object) -> np.ndarray:
    import numpy as np

    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        return np.asarray(x.detach().cpu().numpy())
    return np.asarray(x)


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, tuple | list) else (x,)


# --- export internals -----------------------------------------------------------------------

def _input_names(names: Sequence[str], count: int) -> list[str]:
    names = list(names)
    if len(names) == count:
        return names
    if names == ["input"]:  # the default, with a model of several inputs
        return [f"input_{i}" for i in range(count)]
    raise InvalidArgumentError(f"{len(names)} input name(s) {names} for {count} example "
                               f"input(s); give one name per input")


def _has_torchscript_exporter() -> bool:
    # torch 2.9 made the torch.export-based exporter the default and moved the TorchScript
    # one here; before 2.9 it lived in torch.onnx.utils. Either way dynamo=False reaches it.
    return any(importlib.util.find_spec(m) is not None for m in (
        "torch.onnx._internal.torchscript_exporter", "torch.onnx.utils"))


def _export_torchscript(model: Any, inputs: tuple[Any, ...], tmp: Path, names_in: list[str],
                        names_out: list[str], opset: int | None, dynamic_batch: bool) -> None:
    import torch

    axes = ({n: {0: _BATCH_AXIS} for n in [*names_in, *names_out]} if dynamic_batch else None)
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in torch >= 2.9 but still the fast, dependency-
        # free choice; the deprecation notice is not the caller's concern.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            torch.onnx.export(model, inputs, str(tmp), dynamo=False, input_names=names_in,
                              output_names=names_out, opset_version=opset, dynamic_axes=axes,
                              do_constant_folding=True)
        except Exception as e:  # torch raises many kinds (RuntimeError, TypeError, OnnxExporterError)
            raise ModelExportError(f"torch could not export {type(model).__name__} to ONNX "
                                   f"(TorchScript exporter): {type(e).__name__}: {e}") from e


def _export_dynamo(model: Any, inputs: tuple[Any, ...], tmp: Path, names_in: list[str],
                   names_out: list[str], opset: int | None, dynamic_batch: bool) -> None:
    import torch

    if importlib.util.find_spec("onnxscript") is None:
        raise ModelExportError("torch's torch.export-based ONNX exporter needs onnxscript; "
                               f"install the 'torch' extra: {install_hint('torch')}")
    shapes = None
    if dynamic_batch:
        batch = torch.export.Dim(_BATCH_AXIS)
        shapes = tuple({0: batch} for _ in inputs)
        # torch.export specialises a size-1 axis to the constant 1; trace with two rows.
        inputs = tuple(torch.cat([x, x]) if x.shape[0] == 1 else x for x in inputs)
    try:
        with warnings.catch_warnings():
            # torch's own internals trip their deprecation notices; not the caller's concern.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            torch.onnx.export(model, inputs, str(tmp), dynamo=True, input_names=names_in,
                              output_names=names_out, opset_version=opset,
                              dynamic_shapes=shapes, external_data=False, verbose=False)
    except Exception as e:  # torch.onnx.OnnxExporterError and whatever torch.export raises
        raise ModelExportError(f"torch could not export {type(model).__name__} to ONNX "
                               f"(torch.export exporter): {type(e).__name__}: {e}") from e


def _check(path: Path, *, dynamic_batch: bool) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        raise ModelExportError(f"the exported model fails onnx.checker: {e}") from e
    if dynamic_batch:
        graph = onnx.load(str(path), load_external_data=False).graph
        fixed = [i.name for i in graph.input if _first_dim_fixed(i)]
        if fixed:
            raise ModelExportError(f"dynamic_batch was asked for but inputs {fixed} have a "
                                   f"fixed first axis in the exported model")


def _first_dim_fixed(value_info: Any) -> bool:
    dims = value_info.type.tensor_type.shape.dim
    return bool(dims) and dims[0].HasField("dim_value")


@contextmanager
def _atomic_target(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside *target*; rename it onto *target* only on success."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".data")):
            leftover.unlink(missing_ok=True)

