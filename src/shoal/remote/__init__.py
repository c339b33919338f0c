"""``@remote`` and ``RemoteExecutor``: run notebook functions as tracked jobs."""

from shoal.remote._decorator import remote
from shoal.remote._executor import RemoteExecutor, RemoteFuture, get_future, list_futures
from shoal.remote._options import RemoteOptions

__all__ = ["RemoteExecutor", "RemoteFuture", "RemoteOptions", "get_future", "list_futures", "remote"]
