"""Script-mode training: ``Estimator``, ``PyTorch``, ``SKLearn``, ``TrainingInput``.

SageMaker's import paths work too: ``shoal.estimator``, ``shoal.pytorch``, ``shoal.sklearn``,
``shoal.inputs``.
"""

from __future__ import annotations

from shoal.training._estimator import Estimator, TrainingJob
from shoal.training._frameworks import Framework, PyTorch, SKLearn
from shoal.training._huggingface import HuggingFace
from shoal.training._inputs import TrainingInput

__all__ = ["Estimator", "Framework", "HuggingFace", "PyTorch", "SKLearn", "TrainingInput",
           "TrainingJob"]
