"""SageMaker path alias: sagemaker.remote_function.checkpoint_location — re-exports CheckpointLocation from shoal.remote_function."""

from __future__ import annotations

from shoal.remote_function._checkpoint import CheckpointLocation

__all__ = ["CheckpointLocation"]
