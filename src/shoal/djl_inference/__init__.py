"""SageMaker path alias: sagemaker.djl_inference — re-exports shoal.llm's DJLModel and DJLPredictor."""

from __future__ import annotations

from shoal.llm import DJLModel, DJLPredictor

__all__ = ["DJLModel", "DJLPredictor"]
