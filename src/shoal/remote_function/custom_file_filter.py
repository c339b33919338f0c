"""SageMaker path: sagemaker.remote_function.custom_file_filter — re-exports shoal.remote_function."""

from __future__ import annotations

from shoal.remote_function._filter import CustomFileFilter

__all__ = ["CustomFileFilter"]
