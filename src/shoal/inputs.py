"""``sagemaker.inputs``'s path: ``from shoal.inputs import TrainingInput``."""

from __future__ import annotations

from shoal.training import TrainingInput

__all__ = ["TrainingInput"]
