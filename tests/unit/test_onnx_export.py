"""shoal.export.onnx: torch and scikit-learn export, dynamic batch, atomic writes, verify."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from shoal.errors import InvalidArgumentError, ModelExportError, ModelVerificationError  # noqa: E402
from shoal.export.onnx import export, export_sklearn, verify  # noqa: E402


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class TwoInputs(torch.nn.Module):
    def forward(self, a, b):
        return a + b, a * b


class Unexportable(torch.nn.Module):
    def forward(self, x):
        return torch.from_numpy(np.sort(x.numpy()))  # leaves torch: cannot be traced to ONNX


def _first_dims(path: Path) -> list[str | int]:
    graph = onnx.load(str(path)).graph
    out = []
    for value in [*graph.input, *graph.output]:
        d = value.type.tensor_type.shape.dim[0]
        out.append(d.dim_param if d.HasField("dim_param")
                   else d.dim_value if d.HasField("dim_value") else None)
    return out


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_export_has_a_dynamic_batch_axis_and_matches_torch(tmp_path: Path) -> None:
    model = TwoLayer()
    path = export(model, torch.randn(1, 4), tmp_path / "m" / "model.onnx")
    assert path == tmp_path / "m" / "model.onnx"
    assert _first_dims(path) == ["batch", "batch"]
    for rows in (1, 7, 64):  # any batch, though the example had one row
        report = verify(path, model, torch.randn(rows, 4))
        assert report.ok, report
        assert report.outputs[0].shape == (rows, 3)
    assert model.training  # export and verify put the module back as they found it
    assert [p.name for p in path.parent.iterdir()] == ["model.onnx"]  # no temp files left


def test_export_without_dynamic_batch_fixes_the_first_axis(tmp_path: Path) -> None:
    path = export(TwoLayer(), torch.randn(2, 4), tmp_path / "model.onnx", dynamic_batch=False)
    assert _first_dims(path) == [2, 2]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="dimension|Invalid|Got"):
        sess.run(None, {"input": np.zeros((3, 4), np.float32)})


def test_export_names_opset_and_several_inputs(tmp_path: Path) -> None:
    path = export(TwoInputs(), (torch.randn(2, 3), torch.randn(2, 3)), tmp_path / "two.onnx",
                  output_names=("sum", "product"), opset=17)
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == ["input_0", "input_1"]
    assert [o.name for o in proto.graph.output] == ["sum", "product"]
    assert {o.domain: o.version for o in proto.opset_import}[""] == 17
    a, b = np.ones((5, 3), np.float32), np.full((5, 3), 2, np.float32)
    report = verify(path, TwoInputs(), {"input_0": a, "input_1": b})
    assert report.ok and [o.name for o in report.outputs] == ["sum", "product"]
    with pytest.raises(InvalidArgumentError, match="2 input name"):
        export(TwoInputs(), (torch.randn(2, 3),) * 3, tmp_path / "x.onnx", input_names=("a", "b"))


def test_export_with_the_torch_export_exporter(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    model = TwoLayer()
    path = export(model, torch.randn(1, 4), tmp_path / "dyn.onnx", dynamo=True)
    assert _first_dims(path)[0] == "batch"
    assert verify(path, model, torch.randn(5, 4)).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dyn.onnx"]  # one file, no .data


def test_failed_export_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"previous version")
    with pytest.raises(ModelExportError, match="could not export Unexportable"):
        export(Unexportable(), torch.randn(2, 4), target)
    assert target.read_bytes() == b"previous version"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_verify_reports_a_mismatch_and_raises_only_when_strict(tmp_path: Path) -> None:
    model = TwoLayer()
    path = export(model, torch.randn(1, 4), tmp_path / "model.onnx")
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    with torch.no_grad():
        good = model.eval()(torch.from_numpy(x)).numpy()
    assert verify(path, good, x).ok  # reference given as arrays
    assert verify(path, lambda a: good, x).ok  # or as a callable
    off = good.copy()
    off[2, 1] += 0.5
    report = verify(path, off, x)
    assert not report.ok
    assert report.outputs[0].mismatched == 1
    assert report.max_abs_error == pytest.approx(0.5, rel=1e-3)
    assert "MISMATCH" in str(report)
    assert verify(path, off, x, atol=1.0).ok
    with pytest.raises(ModelVerificationError, match="does not match its reference"):
        verify(path, off, x, strict=True)
    wrong_shape = verify(path, good[:3], x)
    assert not wrong_shape.ok and "shape (6, 3) but the reference has (3, 3)" in str(wrong_shape)


@pytest.mark.parametrize("kind", ["classifier", "pipeline", "regressor"])
def test_export_sklearn_without_zipmap(kind: str, tmp_path: Path) -> None:
    pytest.importorskip("skl2onnx")
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 5)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    est = {"classifier": LogisticRegression(), "regressor": LinearRegression(),
           "pipeline": make_pipeline(StandardScaler(), LogisticRegression())}[kind].fit(X, y)
    path = export_sklearn(est, 5, tmp_path / "model.onnx")
    assert not isinstance(_first_dims(path)[0], int)  # any number of rows
    if kind == "regressor":
        report = verify(path, lambda a: est.predict(a).reshape(-1, 1), X)
    else:
        # No ZipMap: probabilities are a plain float tensor, labels an int tensor.
        report = verify(path, lambda a: (est.predict(a), est.predict_proba(a)), X)
        assert [o.name for o in report.outputs] == ["label", "probabilities"]
        assert report.outputs[1].shape == (80, 2)
    assert report.ok, report


def test_export_sklearn_rejects_bad_feature_counts(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="n_features"):
        export_sklearn(object(), 0, tmp_path / "m.onnx")
