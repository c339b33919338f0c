"""SageMaker path alias: sagemaker.huggingface.estimator — re-exports shoal.llm's HuggingFace."""

from __future__ import annotations

from shoal.llm import HuggingFace

__all__ = ["HuggingFace"]
