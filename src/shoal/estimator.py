"""SageMaker path alias: sagemaker.estimator — re-exports shoal.training.Estimator and Framework."""

from __future__ import annotations

from shoal.training import Estimator, Framework

EstimatorBase = Estimator

__all__ = ["Estimator", "EstimatorBase", "Framework"]
