"""SageMaker's ``sagemaker.remote_function`` import path: replace ``sagemaker`` with ``shoal``."""

from shoal.remote import RemoteExecutor, get_future, list_futures, remote
from shoal.remote._filter import CustomFileFilter

__all__ = ["CustomFileFilter", "RemoteExecutor", "get_future", "list_futures", "remote"]
