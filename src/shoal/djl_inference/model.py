"""SageMaker path alias: sagemaker.djl_inference.model — re-exports shoal.llm's DJLModel."""

from __future__ import annotations

from shoal.llm import DJLModel

__all__ = ["DJLModel"]
