"""``shoal endpoints``: list, describe, invoke, delete; and ``shoal serve`` (foreground)."""

from __future__ import annotations

import enum
import inspect
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shoal.cli._complete import complete_endpoint
from shoal.cli._context import emit, err, out, state
from shoal.cli._render import format_time, key_values, listing, mask_env, print_json, shorten

if TYPE_CHECKING:
    from rich.text import Text

    from shoal.core.endpoints import EndpointRecord
    from shoal.endpoints import EndpointService

__all__ = ["app", "endpoint_json", "register_serve", "serve"]

app = typer.Typer(
    help="List, inspect, call and delete endpoints (deploy them with Model.deploy()).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_STYLES = {"Creating": "cyan", "InService": "green", "Updating": "blue",
           "Failed": "bold red", "Deleting": "magenta", "Pending": "cyan",
           "Restarting": "yellow"}


def _status(status: str) -> Text:
    from rich.text import Text

    return Text(str(status), style=_STYLES.get(str(status), ""))


def endpoint_json(record: EndpointRecord) -> dict[str, Any]:
    """Every field of *record* as JSON-ready data, secret-looking env values masked."""
    config = record.config.to_json()
    config["env"] = mask_env(record.config.env)
    return {
        "name": record.name, "status": str(record.status), "owner": record.owner,
        "model_data": record.model_data,
        "config": config, "failure_reason": record.failure_reason,
        "created_at": record.created_at.isoformat(), "updated_at": record.updated_at.isoformat(),
        "supervisor": dict(record.supervisor), "urls": list(record.urls),
        "instances": [{"index": i.index, "host": i.host, "port": i.port, "pid": i.pid,
                       "status": str(i.status), "restarts": i.restarts, "url": i.url}
                      for i in record.instances],
    }


def _service() -> EndpointService:
    from shoal.endpoints import EndpointService

    return EndpointService.for_session(state.session())


@app.command("list")
def list_endpoints(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List endpoints, newest first."""
    records = _service().list()
    if as_json:
        print_json([endpoint_json(r) for r in records])
        return
    if not records:
        from shoal.storage.sql import redact_url

        settings = state.session().settings
        where = settings.server_url or redact_url(settings.resolved_metadata_url())
        err().print(f"no endpoints in {where}")
        return
    table = listing("name", "status", "owner", "instances", "created", "model", "failure",
                    wrap=("failure",))
    for r in records:
        serve = r.supervisor.get("backend") == "ray-serve"
        table.add_row(r.name, _status(r.status), r.owner,
                      f"{r.config.instance_count} replica"
                      f"{'s' if r.config.instance_count != 1 else ''} (Ray Serve)" if serve
                      else f"{len(r.serving)}/{r.config.instance_count} in service",
                      format_time(r.created_at), shorten(r.model_data, 60),
                      shorten(r.failure_reason))
    emit(table)


def _supervisor_row(sup: dict[str, Any]) -> tuple[str, str]:
    if sup.get("backend") == "ray-serve":
        return ("Ray Serve", f"application {sup.get('application')}, route "
                             f"{sup.get('route_prefix')}")
    return ("supervisor", f"pid {sup['pid']} on {sup.get('host', '?')}" if sup.get("pid")
            else "not started")


@app.command()
def describe(
    name: Annotated[str, typer.Argument(help="The endpoint's name.",
                                        autocompletion=complete_endpoint)],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Show an endpoint: its model, config, state, failure reason and instances."""
    from rich.text import Text

    service = _service()
    r = service.get(name)
    logs = state.session().artifacts.uri(f"endpoints/{name}/logs")
    proxied = _proxied_url(name)
    if as_json:
        data = endpoint_json(r)
        data["logs_uri"] = logs
        if proxied is not None:
            data["invocation_url"] = proxied
        print_json(data)
        return
    cfg = r.config
    batching = (f"max_batch_size {cfg.batching.max_batch_size}, max_batch_delay_ms "
                f"{cfg.batching.max_batch_delay_ms:g}" if cfg.batching else "off")
    sup = dict(r.supervisor)
    rows: list[tuple[str, Any]] = [
        ("name", r.name), ("status", _status(r.status)), ("owner", r.owner),
        *([("url", proxied), ("model servers", ", ".join(
            f"{u}/invocations" for u in r.urls) or "-")] if proxied is not None else
          [("url", ", ".join(f"{u}/invocations" for u in r.urls) or "-")]),
        ("model data", r.model_data),
        ("instance type", cfg.instance_type), ("instance count", str(cfg.instance_count)),
        ("batching", batching), ("code", cfg.entry_point or ("shipped" if cfg.code else "-")),
        ("own environment", "yes" if cfg.requirements else "from code/requirements.txt, if any"),
        ("env", ", ".join(f"{k}={v}" for k, v in mask_env(cfg.env).items()) or "-"),
        _supervisor_row(sup),
        ("created", format_time(r.created_at)), ("updated", format_time(r.updated_at)),
        ("logs", logs)]
    if r.failure_reason:
        rows.append(("failure reason", Text(r.failure_reason, style="red")))
    out().print("Endpoint", style="bold")
    emit(key_values(rows))
    if r.instances:
        table = listing("index", "url", "pid", "status", "restarts", right=("restarts",))
        for i in r.instances:
            table.add_row(str(i.index), i.url, str(i.pid or "-"), _status(i.status),
                          str(i.restarts))
        out().print()
        out().print("Instances", style="bold")
        emit(table)


def _proxied_url(name: str) -> str | None:
    """Through a team server: where clients invoke *name* (the server passes it on to the
    model servers, whose addresses are its host's); None without one."""
    from urllib.parse import quote

    from shoal.core.api import API_PREFIX

    url = state.session().settings.server_url
    if url is None:
        return None
    return f"{url.rstrip('/')}{API_PREFIX}/endpoints/{quote(name, safe='')}/invocations"


@app.command()
def invoke(
    name: Annotated[str, typer.Argument(help="The endpoint's name.",
                                        autocompletion=complete_endpoint)],
    body: Annotated[str, typer.Option(
        "--body", "-b", help="The request body: text (JSON by default), or @FILE to send a "
                             "file's bytes.")],
    content_type: Annotated[str, typer.Option(
        "--content-type", help="The body's media type.")] = "application/json",
    accept: Annotated[str, typer.Option(
        "--accept", help="The media type to ask for.")] = "application/json",
) -> None:
    """Send one request to ``/invocations`` and print the answer (through a team server:
    to its ``/api/v1/endpoints/NAME/invocations``)."""
    from shoal.deserializers import BytesDeserializer
    from shoal.endpoints import Predictor
    from shoal.errors import InvalidArgumentError
    from shoal.serializers import IdentitySerializer

    if body.startswith("@"):
        path = Path(body[1:]).expanduser()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the body file {path}: {e.strerror}",
                                       path=str(path)) from None
    else:
        data = body.encode()
    with Predictor(name, sagemaker_session=state.session(),
                   serializer=IdentitySerializer(content_type),
                   deserializer=BytesDeserializer(accept)) as predictor:
        answer = predictor.predict(data)
    try:
        text = answer.decode("utf-8")
    except UnicodeDecodeError:
        sys.stdout.buffer.write(answer)
        sys.stdout.flush()
        return
    print(text)


@app.command()
def delete(name: Annotated[str, typer.Argument(help="The endpoint's name.")]) -> None:
    """Stop an endpoint's servers and remove it."""
    _service().delete(name)
    err().print(f"deleted endpoint {name}")


def _serve_parameters() -> list[inspect.Parameter]:
    """``shoal serve``'s options, generated from the server's own flags (serving/flags.py)."""
    from shoal.serving.flags import FLAGS

    params = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=Annotated[str, typer.Argument(
                                    metavar="PATH_OR_URI", help="model directory, "
                                    "model.tar.gz, or an fsspec URL of either")])]
    for f in FLAGS:
        names = [f.flag, *([f.short] if f.short else [])]
        if f.kind is bool:  # a switch: '--reuse-port', no '--no-' twin
            switch = typer.Option(*names, help=f.help_text(), show_default=False)
            params.append(inspect.Parameter(f.field, inspect.Parameter.KEYWORD_ONLY,
                                            default=False, annotation=Annotated[bool, switch]))
            continue
        option = typer.Option(*names, help=f.help_text(), metavar=f.metavar, show_default=False)
        kind: Any = enum.StrEnum(f.field, {c: c for c in f.choices}) if f.choices else f.kind
        if f.multiple:  # repeat the flag for each value
            kind = list[kind]
        params.append(inspect.Parameter(f.field, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[kind | None, option]))
    return params


def serve(model: str, **flags: Any) -> None:
    """Serve a model in the foreground: /ping, /invocations, /metrics.

    The same options as 'python -m shoal.serving', which this runs (in this process: signals
    reach it)."""
    from shoal.config import child_environ
    from shoal.serving.flags import FLAGS

    argv = [sys.executable, "-m", "shoal.serving", "--model", model]
    env = child_environ()
    for f in FLAGS:
        value = flags.get(f.field)
        if value is None or value is False:
            continue
        if value is True:  # a switch
            argv.append(f.flag)
            continue
        if f.via_env:  # in the environment, not in the process list
            env[f.via_env] = str(value)
            continue
        if f.multiple:
            argv += [f.flag, *map(str, value)]
            continue
        argv += [f.flag, f"{value:g}" if isinstance(value, float) else str(value)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def register_serve(app: typer.Typer) -> None:
    """Add ``shoal serve`` to *app*."""
    signature = inspect.Signature(_serve_parameters())
    # typer reads the options from the signature: the function itself takes **flags.
    serve.__signature__ = signature  # type: ignore[attr-defined]
    serve.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    app.command("serve")(serve)
