"""SageMaker path alias: sagemaker.pytorch — re-exports shoal.training.PyTorch and PyTorchModel."""

from __future__ import annotations

from shoal.pytorch.model import PyTorchModel, PyTorchPredictor
from shoal.training import PyTorch

__all__ = ["PyTorch", "PyTorchModel", "PyTorchPredictor"]
