"""``Predictor``: send requests to an endpoint's instances, SageMaker's way.

The endpoint's address comes from its record: one URL that its instances share (the kernel
spreads connections over the ones that are loaded and alive), or, for an endpoint whose
instances each have their own (an LLM's), round-robin over those in service. Requests go
through one pooled httpx client; a connection error moves on to another address and re-reads
the record (a restarted instance may be back, or gone), for up to ``connect_retry_seconds``. A 4xx/5xx answer raises ``InvocationError`` with the server's
status code and message.

Through a team server (``SHOAL_SERVER_URL``) requests go to its
``POST /api/v1/endpoints/{name}/invocations`` on the session's connection (the model servers
listen on the server's host), which passes the model server's answer through: a model
server's refusal is the same ``InvocationError``; the server's own errors are its classes (404
``EndpointNotFound``, 503 ``EndpointNotInServiceError``, 502 ``EndpointUnreachableError``,
retried for ``connect_retry_seconds`` while the request reached no model server).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from shoal.core.api import INVOCATION_HEADER
from shoal.core.endpoints import EndpointInstance
from shoal.deserializers import JSONDeserializer
from shoal.endpoints._service import EndpointService, raise_unless_serving
from shoal.errors import EndpointUnreachableError, InvocationError, ServingError
from shoal.serializers import JSONSerializer

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["Predictor"]

# SageMaker runtime's request arguments and the headers the serving contract reads.
_HEADERS = {"CustomAttributes": "X-Amzn-SageMaker-Custom-Attributes",
            "TargetModel": "X-Amzn-SageMaker-Target-Model",
            "TargetVariant": "X-Amzn-SageMaker-Target-Variant",
            "InferenceId": "X-Amzn-SageMaker-Inference-Id"}


def _session(given: object) -> Session:
    from shoal.session import Session, current

    return given if isinstance(given, Session) else current()


class Predictor:
    """Real-time inference against a deployed endpoint.

    Example:
        >>> from shoal.predictor import Predictor                          # doctest: +SKIP
        >>> from shoal.serializers import CSVSerializer                    # doctest: +SKIP
        >>> p = Predictor("digits", serializer=CSVSerializer())            # doctest: +SKIP
        >>> p.predict([[0.0] * 64])                                        # doctest: +SKIP
    """

    def __init__(self, endpoint_name: str, sagemaker_session: Session | None = None,
                 serializer: Any = None, deserializer: Any = None, component_name: Any = None,
                 *, timeout: float = 60.0, connect_retry_seconds: float = 30.0,
                 **kwargs: Any) -> None:
        self.endpoint_name = endpoint_name
        self.sagemaker_session = _session(sagemaker_session)
        for key, value in kwargs.items():  # SageMaker's own ignores them too (content_type...)
            self.sagemaker_session.report_inert(
                f"Predictor.{key}", f"Predictor({key}={value!r}) has no effect; the serializer "
                "and deserializer set the content types")
        self._report_component(component_name)
        self.serializer = serializer if serializer is not None else JSONSerializer()
        self.deserializer = deserializer if deserializer is not None else JSONDeserializer()
        self.component_name = component_name
        self._timeout = timeout
        self._retry_seconds = connect_retry_seconds
        self._lock = threading.Lock()
        self._client: Any = None
        self._instances: tuple[EndpointInstance, ...] = ()
        self._turn = itertools.count()

    # --- SageMaker's surface ------------------------------------------------------------

    @property
    def content_type(self) -> str:
        return str(self.serializer.CONTENT_TYPE)

    @property
    def accept(self) -> tuple[str, ...]:
        accept = self.deserializer.ACCEPT
        return (accept,) if isinstance(accept, str) else tuple(accept)

    @property
    def endpoint(self) -> str:
        """SageMaker's deprecated alias of ``endpoint_name``."""
        return self.endpoint_name

    def predict(self, data: Any, initial_args: Mapping[str, str] | None = None,
                target_model: str | None = None, target_variant: str | None = None,
                inference_id: str | None = None, custom_attributes: str | None = None,
                component_name: str | None = None) -> Any:
        """Serialize *data*, POST it to ``/invocations`` and deserialize the answer."""
        self._report_component(component_name)
        args = dict(initial_args or {})
        content_type = args.pop("ContentType", None) or self.content_type
        accept = args.pop("Accept", None) or ", ".join(self.accept)
        raw: Any = args.pop("Body", None)
        if raw is None:
            raw = self.serializer.serialize(data)
        body: bytes = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        for key, value in (("TargetModel", target_model), ("TargetVariant", target_variant),
                           ("InferenceId", inference_id),
                           ("CustomAttributes", custom_attributes)):
            if value is not None:
                args[key] = value
        headers = {"Content-Type": content_type, "Accept": accept}
        headers.update({_HEADERS[k]: str(v) for k, v in args.items() if k in _HEADERS})
        response = self._post(body, headers)
        return self.deserializer.deserialize(io.BytesIO(response.content),
                                             response.headers.get("content-type", ""))

    def _report_component(self, component_name: str | None) -> None:
        if component_name is not None:  # an endpoint here serves one model, not components
            self.sagemaker_session.report_inert(
                "component_name", f"component_name={component_name!r} has no effect: a shoal "
                "endpoint serves one model, without inference components")

    def delete_endpoint(self, delete_endpoint_config: bool = True) -> None:
        """Stop the endpoint's servers and remove it."""
        self.close()
        EndpointService.for_session(self.sagemaker_session).delete(self.endpoint_name)

    def delete_model(self) -> None:
        """Nothing to do: a shoal endpoint's model has no record of its own."""

    def describe(self) -> Any:
        """The endpoint's record."""
        return EndpointService.for_session(self.sagemaker_session).get(self.endpoint_name)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __del__(self) -> None:
        # Predictors are rarely closed (SageMaker's need no closing): release the pooled
        # connections when this one goes away rather than leaving sockets to the GC.
        client = getattr(self, "_client", None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Predictor(endpoint_name={self.endpoint_name!r}, serializer={self.serializer!r}"
                f", deserializer={self.deserializer!r})")

    # --- sending ------------------------------------------------------------------------

    def _http(self) -> Any:
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self._timeout, connect=5.0),
                    limits=httpx.Limits(max_keepalive_connections=32, max_connections=64))
            return self._client

    def _refresh(self) -> tuple[EndpointInstance, ...]:
        record = EndpointService.for_session(self.sagemaker_session).get(self.endpoint_name)
        raise_unless_serving(record)
        # Instances that share an address are one destination (the kernel picks the instance).
        self._instances = tuple({i.url: i for i in reversed(record.serving)}.values())[::-1]
        return self._instances

    def _pick(self) -> EndpointInstance | None:
        instances = self._instances
        if not instances:
            return None
        return instances[next(self._turn) % len(instances)]

    def _post(self, body: bytes, headers: dict[str, str]) -> Any:
        import httpx

        if self.sagemaker_session.settings.server_url is not None:
            return self._post_through_server(body, headers)
        client = self._http()
        if not self._instances:
            self._refresh()
        deadline = time.monotonic() + self._retry_seconds
        tried: list[str] = []
        last: Exception | None = None
        delay = 0.05
        while True:
            for _ in range(max(1, len(self._instances))):
                instance = self._pick()
                if instance is None:
                    break
                try:
                    response = client.post(f"{instance.url}/invocations", content=body,
                                           headers=headers)
                except httpx.TimeoutException as e:
                    raise ServingError(
                        f"endpoint {self.endpoint_name!r}: instance {instance.index} "
                        f"({instance.url}) did not answer within {self._timeout:g} s",
                        endpoint=self.endpoint_name) from e
                except httpx.TransportError as e:  # refused or dropped: try another instance
                    last = e
                    tried.append(instance.url)
                    continue
                return self._check(response, f"instance {instance.index}, {instance.url}")
            if time.monotonic() >= deadline:
                break
            time.sleep(delay)  # the supervisor is restarting instances; look again
            delay = min(delay * 2, 0.5)
            self._refresh()
        shown = ", ".join(sorted(set(tried))) or "none in service"
        raise ServingError(f"endpoint {self.endpoint_name!r}: no instance answered within "
                           f"{self._retry_seconds:g} s (tried {shown}); last error: "
                           f"{type(last).__name__ if last else 'none'}: {last}",
                           endpoint=self.endpoint_name) from last

    def _post_through_server(self, body: bytes, headers: dict[str, str]) -> Any:
        import httpx

        connection = self.sagemaker_session.server_connection()
        path = f"/endpoints/{quote(self.endpoint_name, safe='')}/invocations"
        deadline = time.monotonic() + self._retry_seconds
        delay = 0.05
        while True:
            try:
                response = connection.post_raw(path, content=body, headers=headers,
                                               timeout=self._timeout)
            except httpx.ReadTimeout as e:
                raise ServingError(
                    f"endpoint {self.endpoint_name!r} did not answer through the server at "
                    f"{connection.url} within {self._timeout:g} s",
                    endpoint=self.endpoint_name) from e
            if INVOCATION_HEADER in response.headers or response.status_code < 400:
                return self._check(response, f"through the server at {connection.url}")
            error = connection.error("POST", path, response)
            if isinstance(error, EndpointUnreachableError) and \
                    not error.details.get("delivered") and time.monotonic() < deadline:
                time.sleep(delay)  # its instances are restarting; the server looks again
                delay = min(delay * 2, 0.5)
                continue
            raise error

    def _check(self, response: Any, where: str) -> Any:
        if response.status_code < 400:
            return response
        text = response.text.strip()
        message = text
        try:
            data = response.json()
        except ValueError:
            data = None
        if isinstance(data, dict):
            message = _explanation(data) or text
        raise InvocationError(
            f"endpoint {self.endpoint_name!r} answered {response.status_code} ({where}): "
            f"{' '.join(message.split())[:2000]}",
            endpoint=self.endpoint_name, status_code=response.status_code, body=text[:10000])


def _explanation(data: dict[str, Any]) -> str:
    """What a refusal says: ``{"error": what, "detail": why}`` (shoal's servers), or one
    ``message``/``error``/``detail`` (others). Both halves when both are there."""
    parts = [str(data[k]).strip() for k in ("message", "error", "detail")
             if isinstance(data.get(k), str | int | float) and str(data[k]).strip()]
    if isinstance(data.get("error"), dict):  # OpenAI's {"error": {"message": ...}}
        parts.append(str(data["error"].get("message") or "").strip())
    return ": ".join(dict.fromkeys(p for p in parts if p))

