"""The model server's command-line flags, declared once.

``python -m shoal.serving`` (argparse, here) and ``shoal serve`` (typer, in ``shoal.cli``)
are both generated from ``FLAGS``, so they take the same options with the same help texts
and defaults; a flag whose ``field`` is a ``ServerOptions`` field is passed to
``ServerOptions.from_env`` (the flag beats the ``SHOAL_*`` variable, which beats the
default). The defaults shown are read from ``ServerOptions`` and ``ENV_VARS``, never
restated. Plain data: the server's environment need not have typer.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields
from typing import Any

from shoal.serving._options import API_KEY_VAR, DEFAULT_MAX_BATCH_SIZE, ENV_VARS, ServerOptions

__all__ = ["FLAGS", "Flag", "add_to_parser", "option_values"]


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag. *field*: the ``ServerOptions`` field it sets (or, when not one, the name
    the entry point reads). *default*: shown in the help when the field has none to show."""

    field: str
    flag: str
    kind: type
    help: str
    metavar: str | None = None
    short: str | None = None
    choices: tuple[str, ...] = ()
    default: Any = None
    #: ``shoal serve`` hands this one to the server in the environment variable, not in
    #: the server's argv (which other users can read in the process list).
    via_env: str | None = None
    #: takes one or more values (``--flag A B`` in argparse; repeated in ``shoal serve``)
    multiple: bool = False

    @property
    def is_option(self) -> bool:
        return self.field in _FIELDS

    def default_value(self) -> Any:
        if self.is_option:
            value = _FIELDS[self.field]
            return value or None if self.multiple else value
        return self.default

    def help_text(self) -> str:
        notes = []
        shown = self.default_value()
        if self.field == "max_batch_size":
            shown = DEFAULT_MAX_BATCH_SIZE  # for a model that can batch
        if shown is not None:
            notes.append(f"default {shown:g}" if isinstance(shown, float) else f"default {shown}")
        env = _ENV_OF.get(self.field) or self.via_env
        if env:
            notes.append(f"env {env}")
        return self.help + (f" ({'; '.join(notes)})" if notes else "")


_FIELDS: dict[str, Any] = {f.name: (None if f.default is MISSING else f.default)
                           for f in fields(ServerOptions)}
_ENV_OF = {field: var for var, field in ENV_VARS.items()}

FLAGS: tuple[Flag, ...] = (
    Flag("host", "--host", str, "interface to listen on; 0.0.0.0 for every one (in a "
         "container)", metavar="HOST"),
    Flag("port", "--port", int, "port; 0 picks a free one", metavar="PORT", short="-p"),
    Flag("port_file", "--port-file", str, "write the bound port here once the server listens",
         metavar="PATH"),
    Flag("workers", "--workers", int, "worker processes, each with its own copy of the model "
         "(default: one per CPU this process may use)",
         metavar="N"),
    Flag("max_batch_size", "--max-batch-size", int, "requests run together by a model that "
         "can batch; 1 turns batching off", metavar="N"),
    Flag("max_batch_delay_ms", "--max-batch-delay-ms", float, "longest wait for a batch to "
         "fill; needs --max-batch-size", metavar="MS"),
    Flag("max_payload_mb", "--max-payload-mb", float, "largest request body, else 413",
         metavar="MB"),
    Flag("timeout_s", "--timeout-s", float, "answer 504 when an invocation takes longer",
         metavar="S"),
    Flag("max_queue", "--max-queue", int, "answer 503 when more requests wait for the model",
         metavar="N"),
    Flag("read_timeout_s", "--read-timeout-s", float, "longest a client may take to send a "
         "whole request; slower ones get 408 and are closed", metavar="S"),
    Flag("max_connections", "--max-connections", int, "open connections kept; past it a new "
         "one closes the longest-waiting idle or half-sent one, or, when all are busy, gets "
         "503 except for /ping", metavar="N"),
    Flag("api_key", "--api-key", str, "require 'Authorization: Bearer KEY' on every request "
         "but /ping; the variable, unlike the flag, is not in the process list",
         metavar="KEY", via_env=API_KEY_VAR),
    Flag("served_model_name", "--served-model-name", str, "an LLM server's name(s) in "
         "OpenAI's 'model' field and at /v1/models (default: the model's hub id, else its "
         "directory's name)", metavar="NAME", multiple=True),
    Flag("intra_op_threads", "--intra-op-threads", int, "onnxruntime intra-op threads "
         "(default: the runtime's, or the CPUs shared among the workers)", metavar="N"),
    Flag("inter_op_threads", "--inter-op-threads", int, "onnxruntime inter-op threads",
         metavar="N"),
    Flag("log_level", "--log-level", str, "the server's log level",
         choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO"),
    Flag("reuse_port", "--reuse-port", bool, "share --port with other servers "
         "(SO_REUSEPORT), listening only once the model is loaded; --port-file is written "
         "then (an endpoint's instances share one address this way)"),
)


def add_to_parser(parser: argparse.ArgumentParser) -> None:
    """Add every flag to an argparse parser (``python -m shoal.serving``)."""
    for f in FLAGS:
        names = [f.flag, *([f.short] if f.short else [])]
        if f.kind is bool:  # a switch: off unless given
            parser.add_argument(*names, dest=f.field, action="store_true", help=f.help_text())
            continue
        extra: dict[str, Any] = {"choices": list(f.choices)} if f.choices else {}
        if f.multiple:
            extra["nargs"] = "+"
        parser.add_argument(*names, dest=f.field, type=f.kind, metavar=f.metavar,
                            help=f.help_text(), default=None if f.is_option else f.default,
                            **extra)


def option_values(values: dict[str, Any]) -> dict[str, Any]:
    """The ``ServerOptions`` fields among parsed *values* (None: not given; a flag with
    several values as a tuple)."""
    out = {f.field: values.get(f.field) for f in FLAGS if f.is_option}
    for f in FLAGS:
        given = out.get(f.field)
        if f.multiple and given is not None:
            out[f.field] = tuple(given)
    return out
