"""SageMaker path alias: sagemaker.sklearn.model — re-exports shoal.endpoints.SKLearnModel."""

from __future__ import annotations

from shoal.endpoints.framework_models import SKLearnModel, SKLearnPredictor

__all__ = ["SKLearnModel", "SKLearnPredictor"]
