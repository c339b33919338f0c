"""SageMaker path: sagemaker.huggingface.estimator — re-exports shoal.training.HuggingFace."""

from __future__ import annotations

from shoal.training import HuggingFace

__all__ = ["HuggingFace"]
