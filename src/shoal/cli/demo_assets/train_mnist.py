"""Train the PyTorch MNIST example's CNN, SageMaker script-mode style (``shoal demo``).

An unmodified SageMaker training script: the data comes from the ``training`` and ``testing``
channels (``SM_CHANNEL_*``: ``.npz`` files of 28×28 ``images`` in [0, 1] and ``labels``), the
hyperparameters arrive as ``--key value`` arguments, the model goes to ``SM_MODEL_DIR``
(``model.pth``, the state dict, and ``model.onnx``), and a failure is explained in
``SM_OUTPUT_DIR/failure``. The lines ``train_loss=…`` and ``test_accuracy=…`` are what the
estimator's ``metric_definitions`` match.

The ONNX file is checked before the job may succeed: ``onnx.checker`` and onnxruntime against
torch at batch sizes 1 and N (a dynamic batch axis).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MEAN, STD = 0.1307, 0.3081  # the MNIST example's normalisation


class Net(nn.Module):
    """The CNN of github.com/pytorch/examples mnist/main.py."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def parse_args() -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--onnx-tolerance", type=float, default=1e-4,
                   help="largest |onnxruntime - torch| allowed over the log-probabilities")
    p.add_argument("--model-dir", default=env.get("SM_MODEL_DIR", "/opt/ml/model"))
    p.add_argument("--output-dir", default=env.get("SM_OUTPUT_DIR", "/opt/ml/output"))
    p.add_argument("--train", default=env.get("SM_CHANNEL_TRAINING",
                                              "/opt/ml/input/data/training"))
    p.add_argument("--test", default=env.get("SM_CHANNEL_TESTING", "/opt/ml/input/data/testing"))
    return p.parse_args()


def load(channel: str) -> TensorDataset:
    """Every ``.npz`` file of a channel directory, concatenated and normalised."""
    files = sorted(Path(channel).glob("*.npz"))
    if not files:
        raise FileNotFoundError(f"no .npz files in channel directory {channel}")
    images, labels = [], []
    for f in files:
        with np.load(f) as data:
            images.append(data["images"])
            labels.append(data["labels"])
    x = (torch.from_numpy(np.concatenate(images)).float().unsqueeze(1) - MEAN) / STD
    return TensorDataset(x, torch.from_numpy(np.concatenate(labels)).long())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def train_epoch(model: Net, loader: DataLoader[Any], optimizer: torch.optim.Optimizer) -> float:
    model.train()
    total, count = 0.0, 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward is unannotated
        optimizer.step()
        total += loss.item() * len(y)
        count += len(y)
    return total / count


@torch.no_grad()
def evaluate(model: Net, data: TensorDataset) -> tuple[float, float]:
    model.eval()
    x, y = data.tensors
    out = model(x)
    loss = F.nll_loss(out, y).item()
    accuracy = (out.argmax(dim=1) == y).float().mean().item()
    return loss, accuracy


def export_onnx(model: Net, path: Path, sample: torch.Tensor) -> None:
    """TorchScript exporter, chosen explicitly: torch 2.13 still ships it (deprecated), and the
    dynamo exporter would need onnxscript. The batch axis is dynamic."""
    import warnings

    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (sample[:1],), str(path), dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["log_probs"],
                          dynamic_axes={"input": {0: "batch"}, "log_probs": {0: "batch"}})


def check_onnx(model: Net, path: Path, sample: torch.Tensor, tolerance: float) -> float:
    """onnx.checker, then onnxruntime vs torch at batch 1 and N; the largest difference."""
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    worst = 0.0
    model.eval()
    for batch in (sample[:1], sample):
        with torch.no_grad():
            expected = model(batch).numpy()
        [got] = session.run(None, {"input": batch.numpy()})
        if got.shape != expected.shape:
            raise ValueError(f"onnxruntime returned shape {got.shape} for a batch of "
                             f"{len(batch)}; torch returned {expected.shape}")
        diff = float(np.abs(got - expected).max())
        print(f"onnx parity batch={len(batch)}: max_abs_diff={diff:.2e}", flush=True)
        worst = max(worst, diff)
    if not worst < tolerance:
        raise ValueError(f"onnxruntime differs from torch by {worst:.2e} (tolerance "
                         f"{tolerance:.0e})")
    return worst


def main() -> None:
    args = parse_args()
    seed_everything(args.seed)
    train_data, test_data = load(args.train), load(args.test)
    print(f"training on {len(train_data)} images, testing on {len(test_data)}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s)", flush=True)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True,
                        generator=generator)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        train_loss = train_epoch(model, loader, optimizer)
        test_loss, accuracy = evaluate(model, test_data)
        print(f"epoch {epoch}: train_loss={train_loss:.4f} test_loss={test_loss:.4f} "
              f"test_accuracy={accuracy:.4f} ({time.perf_counter() - t0:.1f} s)", flush=True)
    model_dir = Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), model_dir / "model.pth")
    sample = test_data.tensors[0][:64]
    export_onnx(model, model_dir / "model.onnx", sample)
    diff = check_onnx(model, model_dir / "model.onnx", sample, args.onnx_tolerance)
    print(f"saved model.pth and model.onnx (onnx checked, parity {diff:.1e}) to {model_dir}",
          flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        traceback.print_exc()
        out = Path(parse_args().output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "failure").write_text(f"{type(e).__name__}: {e}\n")
        sys.exit(1)
