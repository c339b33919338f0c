"""``shoal demo``, portable bundles: the trained CNN as an Azure Functions app and an ASGI app.

The model is the training section's ``model.tar.gz`` (without it, a small CNN is exported
here); the parity check uses its test digits. The bundles stay under ``SHOAL_HOME/demo-bundles``
to look at. ``verify`` (a fresh virtualenv, then real requests) runs for the ASGI bundle only
when its packages are in uv's cache already, so it takes seconds; otherwise the demo prints the
command.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.text import Text

from shoal.cli._bundle import size_text
from shoal.cli._context import out, state

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["run_bundle_demo"]


def _note(text: str, style: str = "dim") -> None:
    out().print(Text(f"   {text}", style=style))


def _trained_model(session: Session, since: datetime, tmp: Path) -> tuple[str, str, Path | None]:
    """(model_data, where it came from, test digits as .npy or None)."""
    from shoal.core.jobs import JobStatus
    from shoal.core.ports import JobQuery

    for record in session.metadata.list_jobs(JobQuery(
            statuses=(JobStatus.COMPLETED,), created_after=since, limit=50)):
        cfg = record.spec.training
        if cfg is None or not record.name.startswith("train-"):
            continue
        samples = None
        try:
            from shoal.cli._demo_training import prepare_digits

            _, test_dir, _, _ = prepare_digits(tmp / "data")  # the split the job was tested on
            with np.load(test_dir / "digits.npz") as data:
                x = ((data["images"] - 0.1307) / 0.3081)[:, None].astype(np.float32)
            samples = tmp / "test-digits.npy"
            np.save(samples, x)
        except ImportError:
            pass
        return (cfg.model_data(record.name, str(session.artifacts.root)),
                f"training job {record.name}", samples)
    return _exported_cnn(tmp), "the MNIST CNN, untrained, exported here", None


def _exported_cnn(tmp: Path) -> str:
    import torch
    from torch import nn

    # The training script's Net (without dropout, which export drops anyway).
    net = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(),
                        nn.Linear(128, 10), nn.LogSoftmax(dim=1)).eval()
    model_dir = tmp / "cnn"
    model_dir.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes about its TorchScript exporter
        torch.onnx.export(net, (torch.zeros(1, 1, 28, 28),), str(model_dir / "model.onnx"),
                          input_names=["input"], output_names=["log_probs"],
                          dynamic_axes={"input": {0: "batch"}, "log_probs": {0: "batch"}},
                          dynamo=False)
    return str(model_dir)


def _packages_cached(requirements: Path) -> bool:
    """Whether uv can resolve *requirements* from its cache alone (then verify takes seconds)."""
    from shoal.envs import find_uv

    try:
        done = subprocess.run([find_uv(), "pip", "compile", "--offline", "--quiet",
                               "--no-header", "--python", sys.executable, str(requirements)],
                              capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def run_bundle_demo(session: Session, number: int, since: datetime) -> None:
    from shoal.bundles import BundleWarning, verify_bundle
    from shoal.model import Model

    out().print()
    out().print(Text(f"{number}. Model(model_data=...).bundle(target=...): the model as an app for "
                     "another platform (no shoal inside)", style="bold cyan"))
    target_dir = session.home / "demo-bundles"
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shoal-demo-bundle-") as tmp:
        model_data, source, samples = _trained_model(session, since, Path(tmp))
        _note(f"model_data {model_data}  ({source})")
        model = Model(model_data=model_data, sagemaker_session=session)
        records = []
        for target, path in (("azure-functions", target_dir / "digits-azure-functions.zip"),
                             ("asgi", target_dir / "digits-asgi")):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", BundleWarning)
                record = model.bundle(target=target, path=path, force=True, samples=samples)
            records.append(record)
            p = record.parity
            agree = f"{p.agreement:.1%} of {p.samples} " if p.agreement is not None else ""
            what = "test digits" if samples is not None else "random inputs"
            out().print(Text(f"   {target:<16} {size_text(record.zipped_bytes):>8} zipped  "
                             f"{record.path}"))
            _note(f"   {record.weights} weights: {agree}{what} get the source model's class, "
                  f"max |Δ| {p.max_abs_diff or 0:.2g}; files: {', '.join(record.files)}")
            for w in caught:
                _note(f"   warning: {w.message}", style="yellow")
    asgi = records[-1]
    command = f"shoal {state.home_option()}bundle verify {asgi.path}"
    if not _packages_cached(asgi.path / "requirements.txt"):
        _note(f"verify skipped (its packages are not in uv's cache: it would download them); "
              f"run: {command}")
        return
    started = time.monotonic()
    report = verify_bundle(asgi.path, session=session, timeout=60)
    passed = sum(c.ok for c in report.checks)
    style = "bold green" if report.ok else "bold red"
    _note(f"{command}: {passed}/{len(report.checks)} checks passed in "
          f"{time.monotonic() - started:.1f}s (uvicorn app:app in a fresh virtualenv, over "
          f"HTTP; {report.parity.agreement or 0:.1%} agreement with the source model)", style)
