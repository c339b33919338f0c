"""SageMaker path alias: sagemaker.pytorch.model — re-exports shoal.endpoints.PyTorchModel."""

from __future__ import annotations

from shoal.endpoints.framework_models import PyTorchModel, PyTorchPredictor

__all__ = ["PyTorchModel", "PyTorchPredictor"]
