"""SageMaker path alias: sagemaker.huggingface.model — re-exports shoal.llm's HuggingFaceModel."""

from __future__ import annotations

from shoal.llm import HuggingFaceModel, HuggingFacePredictor

__all__ = ["HuggingFaceModel", "HuggingFacePredictor"]
