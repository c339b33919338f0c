"""SageMaker path alias: sagemaker.model — re-exports shoal.endpoints.Model (and FrameworkModel)."""

from __future__ import annotations

from shoal.endpoints import Model
from shoal.endpoints.framework_models import FrameworkModel

__all__ = ["FrameworkModel", "Model"]
