"""Model export: a trained model as a portable file (``shoal.export.onnx``: torch modules and
scikit-learn estimators to ONNX, and ``verify``, onnxruntime's answers against the source).

Importing this package is cheap: torch, onnx, onnxruntime and skl2onnx load inside the
functions that need them. Like the model server it imports no session, job, store or backend
(``.importlinter``, "The model server runs alone").
"""

from __future__ import annotations

__all__: list[str] = []
