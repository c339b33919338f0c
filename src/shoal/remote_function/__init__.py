"""``@remote`` and ``RemoteExecutor``: run notebook functions as tracked jobs.

Lives at SageMaker's import path (``sagemaker.remote_function``), so a port replaces
``sagemaker`` with ``shoal`` in import lines; so do its submodules ``client``,
``checkpoint_location`` and ``custom_file_filter``. (It cannot be ``shoal.remote``: that name
is the decorator itself.)
"""

from shoal.remote_function._checkpoint import CheckpointLocation
from shoal.remote_function._decorator import remote
from shoal.remote_function._executor import (
    RemoteExecutor,
    RemoteFuture,
    get_future,
    list_futures,
)
from shoal.remote_function._filter import CustomFileFilter
from shoal.remote_function._options import RemoteOptions

__all__ = ["CheckpointLocation", "CustomFileFilter", "RemoteExecutor", "RemoteFuture",
           "RemoteOptions", "get_future", "list_futures", "remote"]
