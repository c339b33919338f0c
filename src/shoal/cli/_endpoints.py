"""``shoal endpoints``: list, describe, invoke, delete; and ``shoal serve`` (foreground)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shoal.cli._context import emit, err, out, state
from shoal.cli._render import format_time, key_values, mask_env, shorten

if TYPE_CHECKING:
    from shoal.core.endpoints import EndpointRecord

__all__ = ["app", "endpoint_json", "serve"]

app = typer.Typer(
    help="List, inspect, call and delete endpoints (deploy them with Model.deploy()).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_STYLES = {"Creating": "cyan", "InService": "green", "Updating": "blue",
           "Failed": "bold red", "Deleting": "magenta", "Pending": "cyan",
           "Restarting": "yellow"}


def _status(status: str) -> Any:
    from rich.text import Text

    return Text(str(status), style=_STYLES.get(str(status), ""))


def endpoint_json(record: EndpointRecord) -> dict[str, Any]:
    """Every field of *record* as JSON-ready data, secret-looking env values masked."""
    config = record.config.to_json()
    config["env"] = mask_env(record.config.env)
    return {
        "name": record.name, "status": str(record.status), "model_data": record.model_data,
        "config": config, "failure_reason": record.failure_reason,
        "created_at": record.created_at.isoformat(), "updated_at": record.updated_at.isoformat(),
        "supervisor": dict(record.supervisor),
        "instances": [{"index": i.index, "host": i.host, "port": i.port, "pid": i.pid,
                       "status": str(i.status), "restarts": i.restarts, "url": i.url}
                      for i in record.instances],
    }


def _service() -> Any:
    from shoal.endpoints import EndpointService

    return EndpointService(state.session())


@app.command("list")
def list_endpoints(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List endpoints, newest first."""
    records = _service().list()
    if as_json:
        print(json.dumps([endpoint_json(r) for r in records], indent=2))
        return
    if not records:
        from shoal.storage.sql import redact_url

        err().print(f"no endpoints in {redact_url(state.session().settings.resolved_metadata_url())}")
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAME", "STATUS", "INSTANCES", "CREATED", "MODEL", "FAILURE"):
        table.add_column(column, no_wrap=column != "FAILURE")
    for r in records:
        serve = r.supervisor.get("backend") == "ray-serve"
        table.add_row(r.name, _status(r.status),
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
    name: Annotated[str, typer.Argument(help="The endpoint's name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Show an endpoint: its model, config, state, failure reason and instances."""
    from rich.text import Text

    service = _service()
    r = service.get(name)
    logs = state.session().artifacts.uri(f"endpoints/{name}/logs")
    if as_json:
        data = endpoint_json(r)
        data["logs_uri"] = logs
        print(json.dumps(data, indent=2))
        return
    cfg = r.config
    batching = (f"max_batch_size {cfg.batching.max_batch_size}, max_batch_delay_ms "
                f"{cfg.batching.max_batch_delay_ms:g}" if cfg.batching else "off")
    sup = dict(r.supervisor)
    rows: list[tuple[str, Any]] = [
        ("name", r.name), ("status", _status(r.status)), ("model data", r.model_data),
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
        from rich.table import Table

        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("INDEX", "URL", "PID", "STATUS", "RESTARTS"):
            table.add_column(column, no_wrap=True)
        for i in r.instances:
            table.add_row(str(i.index), i.url, str(i.pid or "-"), _status(i.status),
                          str(i.restarts))
        out().print()
        out().print("Instances", style="bold")
        emit(table)


@app.command()
def invoke(
    name: Annotated[str, typer.Argument(help="The endpoint's name.")],
    body: Annotated[str, typer.Option(
        "--body", "-b", help="The request body: text (JSON by default), or @FILE to send a "
                             "file's bytes.")],
    content_type: Annotated[str, typer.Option(
        "--content-type", help="The body's media type.")] = "application/json",
    accept: Annotated[str, typer.Option(
        "--accept", help="The media type to ask for.")] = "application/json",
) -> None:
    """Send one request to ``/invocations`` and print the answer."""
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


def serve(
    model: Annotated[str, typer.Argument(
        metavar="PATH_OR_URI", help="A model directory, a model.tar.gz, or any fsspec URL.")],
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535)] = 8080,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on; 0.0.0.0 for every interface (in a container, "
                       "or behind an --api-key).")] = "127.0.0.1",
    workers: Annotated[int | None, typer.Option("--workers", min=1)] = None,
    max_batch_size: Annotated[int | None, typer.Option("--max-batch-size", min=1)] = None,
    max_batch_delay_ms: Annotated[float | None, typer.Option(
        "--max-batch-delay-ms", min=0)] = None,
    max_payload_mb: Annotated[float | None, typer.Option("--max-payload-mb", min=0)] = None,
    timeout_s: Annotated[float | None, typer.Option("--timeout-s", min=0)] = None,
    read_timeout_s: Annotated[float | None, typer.Option(
        "--read-timeout-s", min=0, help="Longest a client may take to send a request "
                                        "(default 60).")] = None,
    max_connections: Annotated[int | None, typer.Option(
        "--max-connections", min=1, help="Open connections kept; past it, the longest-waiting "
                                         "idle or half-sent one is closed (default "
                                         "4096).")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="SHOAL_API_KEY", show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every request but /ping.")] = None,
) -> None:
    """Serve a model in the foreground: /ping, /invocations, /metrics (an LLM: its APIs too).

    Listens on 127.0.0.1:8080 unless told otherwise; in a container give --host 0.0.0.0."""
    argv = [sys.executable, "-m", "shoal.serving", "--model", model, "--host", host,
            "--port", str(port)]
    for flag, value in (("--workers", workers), ("--max-batch-size", max_batch_size),
                        ("--max-batch-delay-ms", max_batch_delay_ms),
                        ("--max-payload-mb", max_payload_mb), ("--timeout-s", timeout_s),
                        ("--read-timeout-s", read_timeout_s),
                        ("--max-connections", max_connections)):
        if value is not None:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    env = dict(os.environ)
    if api_key is not None:  # in the environment, not in the process list
        env["SHOAL_API_KEY"] = api_key
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # the server replaces this process: signals reach it
