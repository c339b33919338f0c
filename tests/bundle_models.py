"""Models the bundle tests build from, made once per test session (shared by xdist workers).

- the PyTorch MNIST example's CNN (conv 1→32, conv 32→64, maxpool, linear 9216→128, linear
  128→10: 1.2 M parameters, 4.8 MB as float32), trained for a few seconds on synthetic digits
  (class k is a bright square at the k-th place of a grid, in noise), so its predictions vary
  with the input and parity numbers mean something; exported with ``torch.onnx.export``;
- small ONNX models written with ``onnx.helper``.
"""

from __future__ import annotations

import contextlib
import fcntl
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

MEAN, STD = 0.1307, 0.3081


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def session_shared(factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A directory every xdist worker of this test session shares."""
    base = factory.getbasetemp()
    return (base.parent if worker_id != "master" else base) / "bundles-shared"


def once(root: Path, name: str, make: Callable[[Path], None]) -> Path:
    """``root/name``, made by *make* the first time any worker asks for it."""
    target = root / name
    with _locked(root / f"{name}.lock"):
        if not (target / ".done").exists():
            target.mkdir(parents=True, exist_ok=True)
            make(target)
            (target / ".done").touch()
    return target


def synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = rng.normal(0.0, 0.15, (n, 1, 28, 28)).clip(0, 1).astype(np.float32)
    for i, k in enumerate(labels):
        row, col = divmod(int(k), 4)
        images[i, 0, 2 + row * 9:2 + row * 9 + 7, 1 + col * 7:1 + col * 7 + 6] += 0.9
    return ((images.clip(0, 1) - MEAN) / STD).astype(np.float32), labels


def make_mnist_cnn(directory: Path) -> None:
    """``model.onnx`` (the CNN, briefly trained) and ``samples.npy``/``labels.npy`` (held out)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = F.relu(self.fc1(torch.flatten(x, 1)))
            return F.log_softmax(self.fc2(x), dim=1)

    torch.manual_seed(0)
    net = Net()
    images, labels = synthetic_digits(640, seed=1)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    for step in range(40):
        batch = slice((step % 20) * 32, (step % 20) * 32 + 32)
        optimizer.zero_grad()
        F.nll_loss(net(x[batch]), y[batch]).backward()
        optimizer.step()
    net.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes about the TorchScript exporter
        torch.onnx.export(net, torch.zeros(1, 1, 28, 28), str(directory / "model.onnx"),
                          input_names=["input"], output_names=["log_probs"],
                          dynamic_axes={"input": {0: "batch"}, "log_probs": {0: "batch"}},
                          opset_version=17, dynamo=False)
    held_out, held_labels = synthetic_digits(64, seed=2)
    np.save(directory / "samples.npy", held_out)
    np.save(directory / "labels.npy", held_labels)


def tiny_classifier(path: Path, *, features: int = 4, classes: int = 3,
                    extra: np.ndarray | None = None) -> Path:
    """``path`` (an ONNX file): logits = x @ W + b; *extra* is stored as an (unused) table."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(features, classes)).astype(np.float32),
                                     "W"),
             numpy_helper.from_array(rng.normal(size=(classes,)).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["logits"])]
    if extra is not None:  # an embedding table on a side output: bulk for the size checks
        inits.append(numpy_helper.from_array(extra, "table"))
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "row"))
        nodes.append(helper.make_node("Gather", ["table", "row"], ["first_row"]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])]
    if extra is not None:
        outputs.append(helper.make_tensor_value_info("first_row", TensorProto.FLOAT,
                                                     [1, extra.shape[1]]))
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
