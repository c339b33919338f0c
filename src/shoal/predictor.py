"""``sagemaker.predictor``'s path: ``from shoal.predictor import Predictor``."""

from __future__ import annotations

from shoal.endpoints import Predictor

RealTimePredictor = Predictor  # SageMaker v1's name

__all__ = ["Predictor", "RealTimePredictor"]
