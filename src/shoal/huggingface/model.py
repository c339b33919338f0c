"""SageMaker path alias: sagemaker.huggingface.model — re-exports shoal.llm's HuggingFaceModel."""

from __future__ import annotations

from shoal.llm._sagemaker_models import HuggingFaceModel, HuggingFacePredictor

__all__ = ["HuggingFaceModel", "HuggingFacePredictor"]
