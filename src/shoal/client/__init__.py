"""HTTP clients of a team server's API (``shoal server``), one per store port.

They implement the ports of ``shoal.core.ports`` over ``/api/v1``, so the code above them
(``Run``, ``load_run``, analytics, ``JobService``, ``EndpointService``) works unchanged;
``Session`` picks them when ``SHOAL_SERVER_URL`` is set. This package sits beside
``shoal.storage`` (layer 3): it needs only core, errors and httpx, and ``Session`` (layer 6)
wires it. The server itself (``shoal.server``) sits above the session.
"""

from shoal.client.artifacts import HttpArtifactStore
from shoal.client.backend import HttpBackend, HttpJobEnds
from shoal.client.endpoints import HttpEndpointBackend, HttpEndpointStore
from shoal.client.http import API_VERSION, ServerConnection
from shoal.client.jobs import HttpJobStore
from shoal.client.keys import HttpJobKeys
from shoal.client.runs import HttpRunStore

__all__ = ["API_VERSION", "HttpArtifactStore", "HttpBackend", "HttpEndpointBackend",
           "HttpEndpointStore",
           "HttpJobEnds", "HttpJobKeys", "HttpJobStore", "HttpRunStore", "ServerConnection"]
