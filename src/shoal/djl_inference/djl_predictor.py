"""SageMaker path alias: sagemaker.djl_inference.djl_predictor — re-exports shoal.llm's DJLPredictor."""

from __future__ import annotations

from shoal.llm import DJLPredictor

__all__ = ["DJLPredictor"]
