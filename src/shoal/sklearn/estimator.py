"""SageMaker path alias: sagemaker.sklearn.estimator — re-exports shoal.training.SKLearn."""

from __future__ import annotations

from shoal.training import SKLearn

__all__ = ["SKLearn"]
