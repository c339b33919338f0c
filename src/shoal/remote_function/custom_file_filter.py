"""SageMaker path alias: sagemaker.remote_function.custom_file_filter — re-exports CustomFileFilter from shoal.remote_function."""

from __future__ import annotations

from shoal.remote_function._filter import CustomFileFilter

__all__ = ["CustomFileFilter"]
