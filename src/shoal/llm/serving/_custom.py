"""``option.entryPoint``: the model's own ``model.py`` instead of the built-in engine.

Two contracts, told apart by what the file defines (read with ``ast``, before the port is
bound, so nothing of the user's runs yet):

* **DJL's** ``handle(inputs)`` (DJL Serving's Python engine): ``DjlHandlerApp`` imports the
  file, calls ``handle`` once with an empty ``Input`` carrying the model's properties (the
  initialisation call; the model loads there), then once per ``POST /invocations`` with the
  request's headers as properties and its body as content. The ``Output`` it returns becomes
  the response (code, properties as headers, content as body); ``None`` is 204; a raise is
  424 with DJL's ``{"code", "message", "error"}`` body, and the server keeps serving.
  ``from djl_python import Input, Output`` works without DJL installed (``_djl_python``).
* **The inference toolkit's** ``model_fn``/``input_fn``/``predict_fn``/``output_fn``/
  ``transform_fn`` (and no ``handle``): served by the regular model server's
  ``ScriptHandler``, as ``code/inference.py`` is.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any

from shoal.errors import ModelLoadError
from shoal.llm.serving import _djl_python
from shoal.llm.serving._properties import LlmServingOptions
from shoal.serving import ServerOptions
from shoal.serving.asgi import Receive, Scope, Send
from shoal.serving.http import RequestError, read_body
from shoal.serving.http import respond as _respond
from shoal.serving.http import respond_error as _error
from shoal.serving.loading import LoadingApp, ModelState, answer

__all__ = ["DjlHandlerApp", "EntryPointKind", "check_entry_point", "entry_point_app"]

log = logging.getLogger(__name__)


_KEY = "option.entryPoint"
_TOOLKIT = frozenset({"model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn"})
#: response headers the server writes itself
_OWN_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


class EntryPointKind(StrEnum):
    DJL = "djl"          # handle(inputs)
    TOOLKIT = "toolkit"  # model_fn / predict_fn / ...


def check_entry_point(llm: LlmServingOptions) -> tuple[Path, EntryPointKind]:
    """The entry point's file and contract; ``ModelLoadError`` naming the key and the file
    when it is missing, does not parse, or defines neither ``handle`` nor ``model_fn``...
    Runs no user code."""
    value = llm.entry_point or ""
    script = Path(value)
    script = script if script.is_absolute() else llm.base_dir / script
    named = f"{_KEY}={value!r}"
    if not script.is_file():
        raise ModelLoadError(f"{named}: {script} does not exist; give a Python file relative to "
                             f"{llm.base_dir} (where serving.properties is) or an absolute path",
                             key=_KEY, value=value, path=str(script))
    try:
        tree = ast.parse(script.read_bytes(), filename=str(script))
    except (SyntaxError, ValueError) as e:
        raise ModelLoadError(f"{named}: {script} is not valid Python: {e}", key=_KEY,
                             value=value, path=str(script)) from e
    names, star = _top_level_names(tree)
    if "handle" in names or (star and not names & _TOOLKIT):
        return script, EntryPointKind.DJL
    if names & _TOOLKIT:
        return script, EntryPointKind.TOOLKIT
    raise ModelLoadError(f"{named}: {script} defines no handle(inputs) function (DJL's custom "
                         f"handler) and none of model_fn/input_fn/predict_fn/output_fn/"
                         f"transform_fn; define handle(inputs) returning an Output",
                         key=_KEY, value=value, path=str(script))


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names the module binds at top level, and whether it star-imports."""
    names: set[str] = set()
    star = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    star = True
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
    return names, star


def entry_point_app(llm: LlmServingOptions, options: ServerOptions,
                    on_load_error: Callable[[BaseException], None]) -> Any:
    """The ASGI app serving *llm*'s entry point (checked again here; see ``check_entry_point``)."""
    script, kind = check_entry_point(llm)
    if kind is EntryPointKind.DJL:
        return DjlHandlerApp(llm, script, options, on_load_error=on_load_error)
    from shoal.serving import ModelServerApp
    from shoal.serving.artifact import ResolvedModel
    from shoal.serving.script import ScriptHandler

    handler = ScriptHandler(llm.base_dir, script, options)
    return ModelServerApp(handler, options, resolved=ResolvedModel(llm.base_dir),
                          on_load_error=on_load_error)


def init_properties(llm: LlmServingOptions) -> dict[str, str]:
    """What the initialisation call's ``Input.get_properties()`` holds, as in DJL: every
    ``option.*`` key without its prefix (``model_id``, ``dtype``, the handler's own keys),
    ``model_dir`` and ``device_id`` (-1: CPU)."""
    props = {k[len("option."):]: v for k, v in llm.properties.items()
             if k.lower().startswith("option.")}
    props["model_dir"] = str(llm.base_dir)
    props.setdefault("device_id", "-1")
    return props


class DjlHandlerApp(LoadingApp[Callable[[Any], Any]]):
    """ASGI app around a DJL ``handle(inputs)``: ``/ping``, ``POST /invocations``,
    ``/metrics``. The handler runs on one thread of its own (as DJL's Python worker runs one
    request at a time), never on the event loop.

    Example::

        app = DjlHandlerApp(llm, Path("model/model.py"), ServerOptions())
        uvicorn.run(app, port=8080)
    """

    def __init__(self, llm: LlmServingOptions, script: Path, server: ServerOptions, *,
                 on_load_error: Callable[[BaseException], None] | None = None) -> None:
        from shoal.serving.metrics import ServerMetrics

        super().__init__(api_key=server.api_key, on_load_error=on_load_error,
                         load_timeout_s=llm.model_loading_timeout)
        self.llm = llm
        self.script = script
        self.server = server
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="shoal-djl-handler")
        self._handle: Callable[[Any], Any] | None = None
        self._djl: ModuleType | None = None
        self._module_name = script.stem
        self._registered = False
        self._pending = 0
        self._limit = int(server.max_payload_mb * 1024 * 1024)
        self._request_properties = {"model_dir": str(llm.base_dir), "device_id": "-1"}
        self.metrics = ServerMetrics(queue_depth=lambda: self._pending,
                                     loaded=lambda: float(self.state is ModelState.READY))

    @property
    def named(self) -> str:
        return f"{_KEY}={self.llm.entry_point!r} ({self.script})"

    # --- lifespan -------------------------------------------------------------------------

    def start_loading(self, target: Callable[[], None]) -> None:
        self._worker.submit(target)  # on the handler's thread, where handle() runs later

    async def on_shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.close()

    def close(self) -> None:
        """Forget the entry point's module and the ``djl_python`` stand-in."""
        module = sys.modules.get(self._module_name)
        if module is not None and getattr(module, "__file__", None) == str(self.script):
            del sys.modules[self._module_name]
        if self._registered:
            _djl_python.unregister()
            self._registered = False

    def load(self) -> Callable[[Any], Any]:
        """On the handler's thread: import the file, then the initialisation call."""
        log.info("loading %s", self.named)
        self._registered = _djl_python.register()
        self._djl = _djl_python.djl_module()
        module = self._import()
        handle = getattr(module, "handle", None)
        if not callable(handle):
            raise ModelLoadError(f"{self.named} defines no handle(inputs) function; DJL's "
                                 f"custom handler contract needs one", key=_KEY,
                                 value=self.llm.entry_point, path=str(self.script))
        init = self._djl.Input()
        init.properties.update(init_properties(self.llm))
        try:
            handle(init)
        except BaseException as e:
            raise ModelLoadError(f"{self.named}: handle() raised at initialisation (the "
                                 f"call with an empty Input, at load): "
                                 f"{type(e).__name__}: {e}", key=_KEY,
                                 value=self.llm.entry_point, path=str(self.script)) from e
        loaded: Callable[[Any], Any] = handle
        self._handle = loaded
        return loaded

    def load_failure(self, error: BaseException) -> ModelLoadError:
        return ModelLoadError(f"{self.named}: loading failed: {type(error).__name__}: {error}",
                              key=_KEY, value=self.llm.entry_point)

    def load_timeout_message(self) -> str:
        return (f"{self.named} did not finish its initialisation call within "
                f"option.model_loading_timeout={self.load_timeout_s:g} s; raise it in "
                f"serving.properties")

    def _import(self) -> ModuleType:
        code_dir = str(self.script.parent)
        if code_dir not in sys.path:
            sys.path.insert(0, code_dir)  # model.py imports its siblings, as under DJL
        spec = importlib.util.spec_from_file_location(self._module_name, self.script)
        if spec is None or spec.loader is None:
            raise ModelLoadError(f"{self.named}: cannot import it", key=_KEY,
                                 value=self.llm.entry_point, path=str(self.script))
        module = importlib.util.module_from_spec(spec)
        sys.modules[self._module_name] = module  # as DJL imports it: pickles find its classes
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            sys.modules.pop(self._module_name, None)
            raise ModelLoadError(f"{self.named}: importing it failed: {type(e).__name__}: {e}",
                                 key=_KEY, value=self.llm.entry_point,
                                 path=str(self.script)) from e
        return module

    def became_ready(self, loaded: Callable[[Any], Any], seconds: float) -> None:
        log.info("model ready in %.2f s: %s, handle(inputs) one request at a time", seconds,
                 self.named)

    # --- requests -------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/ping" and method in ("GET", "HEAD"):
            if self.state is ModelState.READY:
                await _respond(send, 200, b'{"status":"healthy"}', b"application/json")
            else:
                await _error(send, self.not_ready())
        elif path == "/metrics" and method == "GET":
            await _respond(send, 200, self.metrics.render(), self.metrics.content_type.encode())
        elif path == "/invocations" and method == "POST":
            await self._invoke(scope, receive, send)
        elif path == "/invocations":
            await _error(send, RequestError(405, "method not allowed", "POST /invocations"))
        else:
            await _error(send, RequestError(404, "not found", f"{method} {path}: this server "
                                            f"answers GET /ping, POST /invocations and GET "
                                            f"/metrics"))

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def run() -> int:
            if self.state is not ModelState.READY or self._djl is None:
                raise self.not_ready()
            if self._pending >= self.server.max_queue:
                raise RequestError(503, "overloaded", f"{self._pending} requests already wait "
                                   f"for the handler (max_queue {self.server.max_queue})",
                                   headers=((b"retry-after", b"1"),))
            body = await read_body(receive, self._limit)
            inputs = self._djl.Input()
            inputs.properties.update(self._request_properties)
            for name, value in scope["headers"]:
                inputs.properties[name.decode("latin-1")] = value.decode("latin-1")
            inputs.content.add(key="data", value=bytearray(body))
            # an Output we cannot write is a 500 (answer), and the server keeps serving
            status, headers, payload = await self._call(inputs)
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return status

        await answer(send, run, self.metrics.request, what=f"{self.named}: invocation")

    async def _call(self, inputs: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        self._pending += 1
        try:
            future = self._worker.submit(self._run_handle, inputs)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future),
                                              self.server.timeout_s)
            except TimeoutError:
                raise RequestError(504, "timeout", f"handle() did not answer within "
                                   f"{self.server.timeout_s:g} s (--timeout-s)") from None
        finally:
            self._pending -= 1

    def _run_handle(self, inputs: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """On the handler's thread: one request through ``handle``, as an HTTP response."""
        handle = self._handle
        if handle is None or self._djl is None:
            raise RuntimeError("handle() called before the entry point loaded")
        try:
            output = handle(inputs)
        except Exception as e:  # the request fails, the server stays up (DJL: 424)
            log.exception("%s: handle() raised", self.named)
            output = self._djl.Output().error(str(e) or type(e).__name__)
        if output is None:
            return 204, [], b""
        if not all(hasattr(output, a) for a in ("code", "properties", "content")):
            output = self._djl.Output().error(f"Invalid output type: {type(output)}; "
                                              f"handle() returns an Output or None")
        return _response(output)





def _response(output: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """An ``Output`` as (status, headers, body): the body is the content under ``data``, else
    the first value; ``Content-Type`` is the output's own, else guessed (JSON, text, bytes)."""
    try:
        code = int(output.code)
    except (TypeError, ValueError):
        code = 500
    if not 100 <= code <= 599:
        code = 500
    content = output.content
    value = content.get("data")
    if value is None and content.size():
        value = content.value_at(0)
    body = value.encode() if isinstance(value, str) else bytes(value or b"")
    headers: list[tuple[bytes, bytes]] = []
    content_type = None
    for key, val in dict(output.properties).items():
        name = str(key).lower()
        if name == "content-type":
            content_type = str(val)
        elif name not in _OWN_HEADERS and _token(name):
            headers.append((name.encode("latin-1"), str(val).encode("latin-1", "replace")))
    headers.append((b"content-type", (content_type or _guess_type(body)).encode("latin-1")))
    headers.append((b"content-length", str(len(body)).encode()))
    return code, headers, body


def _token(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name)


def _guess_type(body: bytes) -> str:
    if not body:
        return "application/json"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return "text/plain; charset=utf-8"
    return "application/json"



