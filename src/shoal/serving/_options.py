"""``ServerOptions``: every knob of the model server, declared once and validated once.

Precedence: explicit value (a CLI flag or a keyword) > ``SHOAL_*`` environment > default.
The environment arrives as a mapping (``shoal.config.shoal_environ()``); nothing here reads
the process environment itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shoal.errors import ConfigError

__all__ = ["API_KEY_VAR", "DEFAULT_BATCH_DELAY_MS", "DEFAULT_MAX_BATCH_SIZE", "ENV_VARS",
           "ServerOptions", "default_workers", "usable_cpus"]

#: Used when a handler can batch and no size was given. Tuned in bench/serving.py: with a cap
#: below the client concurrency, two batches alternate, so the model runs one while the event
#: loop answers the other (16 beat 32 at 32 clients on two cores).
DEFAULT_MAX_BATCH_SIZE = 16
#: How long the first request of a batch waits for others when the model is idle. 0: no wait;
#: batches still form from the requests that queue while the model runs (LitServe's default).
DEFAULT_BATCH_DELAY_MS = 0.0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """Worker processes when none were asked for: one per usable CPU, each with one intra-op
    thread (bench/serving_frontends.py: on two cores, two one-thread workers served 1.16-1.38x
    the requests of one worker whose runtime spreads over both in two of three interleaved
    runs, at about the same CPU a request; TorchServe and SageMaker's model servers also
    default to a worker per CPU)."""
    return usable_cpus()


#: Environment variable → ServerOptions field.
ENV_VARS: dict[str, str] = {
    "SHOAL_MODEL_SERVER_WORKERS": "workers",
    "SHOAL_MODEL_SERVER_TIMEOUT": "timeout_s",
    "SHOAL_MAX_BATCH_SIZE": "max_batch_size",
    "SHOAL_MAX_BATCH_DELAY_MS": "max_batch_delay_ms",
    "SHOAL_MODEL_SERVER_MAX_PAYLOAD_MB": "max_payload_mb",
    "SHOAL_MODEL_SERVER_MAX_QUEUE": "max_queue",
    "SHOAL_MODEL_SERVER_READ_TIMEOUT": "read_timeout_s",
    "SHOAL_MODEL_SERVER_MAX_CONNECTIONS": "max_connections",
    "SHOAL_ORT_INTRA_OP_THREADS": "intra_op_threads",
    "SHOAL_ORT_INTER_OP_THREADS": "inter_op_threads",
}

#: The API key's variable. Only the entry points (``python -m shoal.serving``, ``shoal serve``)
#: read it: a server built in Python (``create_app``, an endpoint's replica) takes a key only
#: when given one, so a key in the environment never locks out a ``Predictor``.
API_KEY_VAR = "SHOAL_API_KEY"


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How a model server listens, batches and protects itself.

    Attributes:
        host, port: where to listen; port 0 picks a free port (see ``--port-file``).
        workers: worker processes, each with its own copy of the model and its own socket
            of the port. ``None``: one per CPU this process may use (``default_workers``),
            which ``serve`` (``shoal serve``, ``python -m shoal.serving``) resolves; an app
            built in Python (``create_app``) is one process whatever this says, and an LLM
            is always served by one.
        max_batch_size: requests run together by a handler that can batch. ``None``: 16 for
            such handlers; 1 turns batching off. Ignored (with a warning) by other handlers.
        max_batch_delay_ms: how long the first request of a batch may wait for more while the
            model is idle; needs a size. ``None``: 0, as batches form anyway from the requests
            that queue while the model runs.
        max_payload_mb: request bodies above this are refused with 413 (SageMaker: 6).
        timeout_s: an invocation (queue wait + inference) longer than this is answered 504.
        max_queue: requests waiting for the model beyond this are refused with 503.
        read_timeout_s: the longest a client may take to send a whole request, from its first
            byte (from connecting, for a connection's first request) to its last: headers cut
            short are answered 408, a body cut short is dropped, and the connection closed.
        max_connections: open connections the server keeps. Past it, a new connection
            closes the one that has waited longest for its client (half-sent, or idle between
            requests); when none waits, requests other than ``/ping`` are answered 503 at once.
            The file descriptor limit is raised to fit (lowered, with a warning, where the
            hard limit is smaller).
        api_key: when set, every request but ``/ping`` (and the LLM server's ``/health``)
            must carry ``Authorization: Bearer KEY`` (compared in constant time), or is
            answered 401. Never shown in ``repr``.
        intra_op_threads, inter_op_threads: onnxruntime (and torch) thread pools; ``None``
            leaves the runtime's default, except that with several workers each ONNX session
            gets its share of the CPUs (``cpus // workers`` intra-op threads).
        served_model_name: the names an LLM server answers to in OpenAI's ``model`` field
            and lists at ``/v1/models`` (vLLM's ``--served-model-name``); empty: the model's
            name (its hub id, else its directory's name).

    Example::

        ServerOptions(port=0, max_batch_size=16, max_batch_delay_ms=1)
    """

    host: str = "127.0.0.1"
    port: int = 8080
    workers: int | None = None
    max_batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    max_payload_mb: float = 6.0
    timeout_s: float = 60.0
    max_queue: int = 1024
    read_timeout_s: float = 60.0
    max_connections: int = 4096
    api_key: str | None = field(default=None, repr=False)
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    served_model_name: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _int(self, "port", minimum=0, maximum=65535)
        if self.workers is not None:
            _int(self, "workers", minimum=1)
        _int(self, "max_queue", minimum=1)
        if self.max_batch_size is not None:
            _int(self, "max_batch_size", minimum=1)
        if self.max_batch_delay_ms is not None:
            _number(self, "max_batch_delay_ms", positive=False)
            if self.max_batch_size is None:
                raise ConfigError("max_batch_delay_ms was given without max_batch_size; set "
                                  "both (--max-batch-size N --max-batch-delay-ms MS, or "
                                  "SHOAL_MAX_BATCH_SIZE and SHOAL_MAX_BATCH_DELAY_MS)")
        _number(self, "max_payload_mb", positive=True)
        _number(self, "timeout_s", positive=True)
        _number(self, "read_timeout_s", positive=True)
        _int(self, "max_connections", minimum=1)
        if self.api_key is not None and (not isinstance(self.api_key, str)
                                         or not self.api_key.strip()):
            raise ConfigError("api_key is blank; give a non-empty key (--api-key, or "
                              f"{API_KEY_VAR}), or none to serve without one")
        for name in ("intra_op_threads", "inter_op_threads"):
            if getattr(self, name) is not None:
                _int(self, name, minimum=1)
        names = self.served_model_name
        if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"served_model_name must be a tuple of non-empty names, got "
                              f"{names!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a non-empty string, got {self.host!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **explicit: Any) -> ServerOptions:
        """Options from ``SHOAL_*`` variables in *environ*, overridden by *explicit* values
        that are not ``None``."""
        values: dict[str, Any] = {}
        for var, name in ENV_VARS.items():
            raw = environ.get(var, "").strip()
            if raw:
                values[name] = _parse(var, name, raw)
        unknown = set(explicit) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown server option(s) {sorted(unknown)}")
        values.update({k: v for k, v in explicit.items() if v is not None})
        return cls(**values)

    @property
    def batching_requested(self) -> bool:
        """True when a batch size above 1 was asked for explicitly."""
        return self.max_batch_size is not None and self.max_batch_size > 1

    def batch_limits(self, *, batchable: bool) -> tuple[int, float]:
        """``(max_batch_size, max_batch_delay_s)`` for a handler that can (not) batch."""
        if not batchable:
            return 1, 0.0
        size = DEFAULT_MAX_BATCH_SIZE if self.max_batch_size is None else self.max_batch_size
        delay = DEFAULT_BATCH_DELAY_MS if self.max_batch_delay_ms is None \
            else self.max_batch_delay_ms
        return size, (delay / 1000.0 if size > 1 else 0.0)

    def with_port(self, port: int) -> ServerOptions:
        return replace(self, port=port)

    @property
    def worker_count(self) -> int:
        """The worker processes these options ask for (``workers``, else one per usable
        CPU)."""
        return self.workers if self.workers is not None else default_workers()


def _parse(var: str, name: str, raw: str) -> Any:
    kind = _FIELD_KINDS[name]
    try:
        return int(raw) if kind is int else float(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{var}={raw!r} is not {what} (it sets {name})") from None


def _int(options: ServerOptions, name: str, *, minimum: int, maximum: int | None = None) -> None:
    value = getattr(options, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be {bound}, got {value}")


def _number(options: ServerOptions, name: str, *, positive: bool) -> None:
    value = getattr(options, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value}")


_FIELD_KINDS: dict[str, type] = {
    "workers": int, "timeout_s": float, "max_batch_size": int, "max_batch_delay_ms": float,
    "max_payload_mb": float, "max_queue": int, "read_timeout_s": float, "max_connections": int,
    "intra_op_threads": int, "inter_op_threads": int,
}
