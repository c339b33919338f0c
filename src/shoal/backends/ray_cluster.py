"""A Ray cluster on this machine for the ray backend: start a head or a joining node with
``ray start`` (bound to 127.0.0.1, every port chosen free, token authentication), and stop
exactly the processes of the nodes started from a shoal home (never another Ray cluster).

The head also runs Ray's client server (``ray://127.0.0.1:PORT``, default port 10001), for
clients that connect through Ray Client rather than as a driver on a node.

Under ``SHOAL_HOME/ray``: ``auth_token`` (mode 0600), ``nodes.json`` (each node's tag,
temporary directory and addresses) and each node's ``ray start`` log. Runs the ``ray``
command; never imports ray. The ``shoal ray up|down`` commands are the user interface.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["cluster_dir", "ensure_token", "ray_env", "start_node", "stop_nodes"]


def cluster_dir(home: Path) -> Path:
    return Path(home) / "ray"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_bin() -> str:
    from shoal._internal.extras import require

    require("ray", "shoal ray up", "ray")
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else "ray"


def ensure_token(directory: Path) -> Path:
    path = directory / "auth_token"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def ray_env(token: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for Ray's processes and clients: token authentication on, this token."""
    env = dict(os.environ if base is None else base)
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                "RAY_USAGE_STATS_ENABLED": "0"})
    env.pop("RAY_AUTH_TOKEN", None)  # the file is the one source of the token
    # Serve's controller kills an HTTP proxy after 3 health checks of 10 s fail in a row,
    # which a 2-core node under load does (the proxy died 'killed by ray.kill' mid-deploy);
    # 30 s each keeps a slow proxy, and a user's own setting wins.
    env.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")
    # A new proxy that is not ready within 5 s (Serve's default) is killed the same way.
    env.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
    return env


def start_node(home: Path, *, port: int | None = None, address: str | None = None,
               num_cpus: int | None = None, resources: Mapping[str, float] | None = None,
               object_store_mb: int = 100, client_port: int | None = None,
               timeout: float = 120.0) -> dict[str, Any]:
    """Start a head (no *address*) or a node joining *address*; return its record (a head's
    has ``client_address``, its Ray Client address on *client_port*)."""
    directory = cluster_dir(home)
    token = ensure_token(directory)
    head = address is None
    gcs_port = (port or 6379) if head else None
    ray_client_port = (client_port or 10001) if head else None
    tag = f"head-{gcs_port}" if head else f"node-{_free_port()}"
    # Ray keeps unix sockets under the temp dir: keep its path short (108-byte limit).
    temp = Path(tempfile.gettempdir()) / f"shoal-ray-{os.getuid()}-{secrets.token_hex(3)}"
    argv = [_ray_bin(), "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
            "--temp-dir", str(temp), "--object-store-memory", str(object_store_mb * 1024 * 1024),
            # Every port chosen here: two nodes (or clusters) on one machine never collide.
            "--dashboard-agent-listen-port", str(_free_port()),
            "--dashboard-agent-grpc-port", str(_free_port()),
            "--runtime-env-agent-port", str(_free_port()),
            "--metrics-export-port", str(_free_port())]
    if head:
        argv += ["--head", "--port", str(gcs_port), "--include-dashboard=false",
                 "--dashboard-port", str(_free_port()),
                 "--ray-client-server-port", str(ray_client_port)]
    else:
        argv += ["--address", str(address)]
    if num_cpus is not None:
        argv += ["--num-cpus", str(num_cpus)]
    if resources:
        argv += ["--resources", json.dumps(dict(resources))]
    log = directory / f"{tag}.log"
    with open(log, "wb") as f:
        done = subprocess.run(argv, env=ray_env(token), stdin=subprocess.DEVNULL, stdout=f,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if done.returncode != 0:
        client = (ray_client_port, gcs_port) if ray_client_port and gcs_port else None
        _kill_tree(_processes_under(temp, client))
        from shoal.errors import BackendUnavailableError

        tail = log.read_text(errors="replace")[-3000:]
        raise BackendUnavailableError(f"'ray start' failed (exit code {done.returncode}); its "
                                      f"log {log} ends with:\n{tail}", log=str(log))
    _watch(temp, directory / f"{tag}.watch.log")
    record: dict[str, Any] = {"tag": tag, "head": head, "temp_dir": str(temp),
                              "address": f"127.0.0.1:{gcs_port}" if head else address}
    if head:
        record["client_address"] = f"ray://127.0.0.1:{ray_client_port}"
    nodes = _read_nodes(directory)
    nodes.append(record)
    (directory / "nodes.json").write_text(json.dumps(nodes, indent=2))
    return record


def _watch(temp: Path, log: Path) -> None:
    """Start the node's watcher (``_raywatch.py``): it ends what the node leaves behind if
    its raylet dies. Detached: it outlives this command."""
    from shoal.backends._raywatch import raylets_of

    pids = [str(p) for p in raylets_of(str(temp))]
    with open(log, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "shoal.backends._raywatch", str(temp), *pids],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True, close_fds=True)


def _read_nodes(directory: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((directory / "nodes.json").read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def _is_client_server(cmdline: bytes, client: tuple[int, int] | None) -> bool:
    """Ray's client server on *client* (its port, its GCS's port): its command line does not
    name the temp dir."""
    if client is None or b"ray.util.client.server" not in cmdline:
        return False
    args = cmdline.split(b"\0")
    return f"--port={client[0]}".encode() in args and any(
        a.startswith(b"--address=") and a.endswith(f":{client[1]}".encode()) for a in args)


def _processes_under(temp: Path, client: tuple[int, int] | None = None) -> list[int]:
    """Pids of the processes of the node whose temp dir is *temp* (and, for a head, of its
    client server: *client* is its port and the GCS port), and their descendants."""
    marker = str(temp).encode()
    parents: dict[int, int] = {}
    roots = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        parents[pid] = int(stat.rpartition(")")[2].split()[1])
        if marker in cmdline or _is_client_server(cmdline, client):
            roots.append(pid)
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    found.discard(os.getpid())
    return sorted(found)


def _kill_tree(pids: list[int], grace: float = 10.0) -> None:
    first = signal.SIGTERM if grace > 0 else signal.SIGKILL
    for pid in pids:
        try:
            os.kill(pid, first)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_exists(p) for p in pids):
        time.sleep(0.1)  # bounded wait for external processes to exit
    for pid in pids:
        if _exists(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _exists(pid: int) -> bool:
    try:
        state_field = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state_field not in ("Z", "X")


def _port_of(address: str | None) -> int | None:
    try:
        return int(str(address).rpartition(":")[2]) if address else None
    except ValueError:
        return None


def stop_nodes(home: Path, *, tag: str | None = None, force: bool = False) -> int:
    """Stop the nodes started from *home* (or only *tag*); return how many were stopped.
    *force* kills them at once (SIGKILL), as a crashed machine would go."""
    import shutil

    directory = cluster_dir(home)
    nodes = _read_nodes(directory)
    keep, stopped = [], 0
    # Workers before the head: the head's GCS should see them leave.
    for node in sorted(nodes, key=lambda n: bool(n.get("head"))):
        if tag is not None and node.get("tag") != tag:
            keep.append(node)
            continue
        ports = _port_of(node.get("client_address")), _port_of(node.get("address"))
        client = (ports[0], ports[1]) if ports[0] and ports[1] else None
        _kill_tree(_processes_under(Path(node["temp_dir"]), client),
                   grace=0.0 if force else 10.0)
        shutil.rmtree(node["temp_dir"], ignore_errors=True)
        stopped += 1
    if directory.exists():
        (directory / "nodes.json").write_text(json.dumps(keep, indent=2))
    return stopped
