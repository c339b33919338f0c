"""SageMaker path alias: sagemaker.inputs — re-exports shoal.training.TrainingInput."""

from __future__ import annotations

from shoal.training import TrainingInput

__all__ = ["TrainingInput"]
