"""SageMaker path alias: sagemaker.remote_function.client — re-exports remote, RemoteExecutor, get_future, list_futures (and Future) from shoal.remote_function."""

from __future__ import annotations

from shoal.remote_function._decorator import remote
from shoal.remote_function._executor import RemoteExecutor, RemoteFuture, get_future, list_futures

Future = RemoteFuture  # SageMaker's name for the future RemoteExecutor.submit returns

__all__ = ["Future", "RemoteExecutor", "get_future", "list_futures", "remote"]
