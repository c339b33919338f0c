"""SageMaker path alias: sagemaker.sklearn — re-exports shoal.training.SKLearn and SKLearnModel."""

from __future__ import annotations

from shoal.sklearn.model import SKLearnModel, SKLearnPredictor
from shoal.training import SKLearn

__all__ = ["SKLearn", "SKLearnModel", "SKLearnPredictor"]
