"""Path alias: shoal.models.onnx — re-exports export, export_sklearn, verify and their report
types from shoal.export.onnx (the older path of ONNX export)."""

from __future__ import annotations

from shoal.export.onnx import OutputComparison, VerificationReport, export, export_sklearn, verify

__all__ = ["OutputComparison", "VerificationReport", "export", "export_sklearn", "verify"]
