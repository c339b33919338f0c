"""SageMaker path alias: sagemaker.pytorch.estimator — re-exports shoal.training.PyTorch."""

from __future__ import annotations

from shoal.training import PyTorch

__all__ = ["PyTorch"]
