"""``shoal ray up|down``: a Ray cluster on this machine (or a node joining one) for the ray
backend, bound to 127.0.0.1 and protected by a token (``shoal.backends.ray_cluster``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli._context import out, state

__all__ = ["app"]

app = typer.Typer(help="Start and stop a Ray cluster for the ray backend (SHOAL_BACKEND=ray).",
                  no_args_is_help=True, rich_markup_mode=None)


def _home() -> Path:
    from shoal.config import Settings

    return Path(Settings(**state.session_kwargs()).home)


@app.command()
def up(
    port: Annotated[int, typer.Option(help="GCS port of the head node.")] = 6379,
    num_cpus: Annotated[int | None, typer.Option(
        "--num-cpus", help="CPUs this node offers to jobs (default: all).")] = None,
    address: Annotated[str | None, typer.Option(
        help="Join the cluster at HOST:PORT as a worker node instead of starting a head.")]
        = None,
    resources: Annotated[str | None, typer.Option(
        help='Custom resources of this node, as JSON: \'{"gpu-pool": 1}\'.')] = None,
    object_store_mb: Annotated[int, typer.Option(
        "--object-store-mb", help="Object store size of this node, in MB.")] = 100,
    client_port: Annotated[int, typer.Option(
        "--client-port", help="Port of the head's Ray Client server (ray://127.0.0.1:PORT).")]
        = 10001,
) -> None:
    """Start a Ray head on 127.0.0.1 (or a node joining one) with token authentication."""
    from shoal.backends.ray_cluster import cluster_dir, start_node

    home = _home()
    parsed = json.loads(resources) if resources else None
    record = start_node(home, port=port, address=address, num_cpus=num_cpus, resources=parsed,
                        object_store_mb=object_store_mb, client_port=client_port)
    token = cluster_dir(home) / "auth_token"
    console = out()
    what = "head" if record["head"] else "node"
    console.print(f"Ray {what} {record['tag']} started: {record['address']} "
                  f"(temp dir {record['temp_dir']})")
    console.print("Use it from shoal (the token is found under this home):")
    console.print(f"  export SHOAL_BACKEND=ray SHOAL_RAY_ADDRESS={record['address']}")
    if record.get("client_address"):
        console.print(f"or through Ray Client: SHOAL_RAY_ADDRESS={record['client_address']}")
    console.print(f"Ray's own tools need: export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token}")
    console.print("Stop it with 'shoal ray down'.")


@app.command()
def down(
    node: Annotated[str | None, typer.Option(
        help="Stop only this node (its tag, as 'shoal ray up' printed it).")] = None,
    force: Annotated[bool, typer.Option(
        help="Kill the processes at once (SIGKILL) instead of asking them to stop.")] = False,
) -> None:
    """Stop the Ray nodes started by 'shoal ray up' from this home."""
    from shoal.backends.ray_cluster import stop_nodes

    count = stop_nodes(_home(), tag=node, force=force)
    out().print(f"stopped {count} Ray node(s)" if count else "no Ray node was running")
