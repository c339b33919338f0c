"""``sagemaker.estimator``'s path: ``from shoal.estimator import Estimator``."""

from __future__ import annotations

from shoal.training import Estimator, Framework

EstimatorBase = Estimator

__all__ = ["Estimator", "EstimatorBase", "Framework"]
