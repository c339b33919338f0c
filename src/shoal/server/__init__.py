"""The team server: ``shoal server``, a versioned HTTP API (``/api/v1``) over the stores
configured on the server's host, with users and API tokens.

It serves the ``RunStore``, ``JobStore``, ``EndpointStore`` and ``ArtifactStore`` ports;
clients use ``shoal.client``'s ``HttpRunStore``, ``HttpJobStore``, ``HttpEndpointStore`` and
``HttpArtifactStore`` (``SHOAL_SERVER_URL`` + ``SHOAL_TOKEN``). The package sits above
``shoal.session`` (it takes its stores from a ``Session`` and will run jobs through its
``JobService``); FastAPI, pydantic and uvicorn are imported by ``shoal.server.app`` only, so
``import shoal`` loads none of them.
"""

__all__: list[str] = []
