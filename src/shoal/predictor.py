"""SageMaker path alias: sagemaker.predictor — re-exports shoal.endpoints.Predictor."""

from __future__ import annotations

from shoal.endpoints import Predictor

RealTimePredictor = Predictor  # SageMaker v1's name

__all__ = ["Predictor", "RealTimePredictor"]
