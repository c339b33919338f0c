"""SageMaker path alias: sagemaker.huggingface.estimator — re-exports shoal.huggingface.HuggingFace."""

from __future__ import annotations

from shoal.huggingface._estimator import HuggingFace

__all__ = ["HuggingFace"]
