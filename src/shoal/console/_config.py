"""A job's resolved configuration as its page shows it: each option as the job ran it (read
from its spec), where the value came from (``JobSpec.option_sources``, recorded at submit
time; "not recorded" for older jobs and for jobs whose submitter records none), secrets
masked. No routes here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.console._render import masked
from shoal.core.jobs import JobSpec
from shoal.core.secrets import MASK, is_secret_name

__all__ = ["resolved_options"]

NOT_RECORDED = "not recorded"


def _tags(spec: JobSpec) -> str:
    return ", ".join(f"{k}={MASK if is_secret_name(k) else v}" for k, v in spec.tags)


def _env(spec: JobSpec) -> str:
    shown = masked(dict(spec.environment_variables))
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))


def _workdir(spec: JobSpec) -> str:
    w = spec.workdir
    return "no" if w is None else f"yes ({w.files} files, {w.size_bytes} bytes)"


def _instance(spec: JobSpec) -> str:
    gpus = f", {spec.gpus} GPU" if spec.gpus else ""
    memory = f", {spec.memory_mib} MiB" if spec.memory_mib else ""
    return f"{spec.instance_type or ''} ({spec.cpus:g} CPU{gpus}{memory})"


#: The options shown, in SageMaker's order, each read from the spec as the job ran it.
_SHOWN: tuple[tuple[str, Callable[[JobSpec], Any]], ...] = (
    ("instance_type", _instance),
    ("instance_count", lambda s: s.distribution.hosts if s.distribution else 1),
    ("dependencies", lambda s: s.dependencies),
    ("pre_execution_commands", lambda s: "; ".join(s.pre_execution_commands)),
    ("pre_execution_script", lambda s: s.pre_execution_script),
    ("environment_variables", _env),
    ("include_local_workdir", _workdir),
    ("job_conda_env", lambda s: s.conda_env),
    ("tags", _tags),
    ("keep_alive_period_in_seconds", lambda s: s.keep_alive_period_in_seconds),
    ("max_retry_attempts", lambda s: s.max_retry_attempts),
    ("max_runtime_in_seconds", lambda s: s.max_runtime_in_seconds),
    ("use_torchrun", lambda s: bool(s.distribution and s.distribution.torchrun)),
    ("allow_cpu_fallback", lambda s: s.allow_cpu_fallback),
    ("stop_grace_period_in_seconds", lambda s: s.stop_grace_period_in_seconds),
)


def _text(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def resolved_options(spec: JobSpec) -> list[dict[str, str]]:
    """Rows of (option, value, source): the options above, then any other option the job's
    submitter recorded a source for (a SageMaker-only setting, kept on the record, or a
    file filter), each value masked when its name or key names a secret."""
    sources = spec.option_sources
    rest = sources.get("*", "default") if sources else NOT_RECORDED

    def source(name: str) -> str:
        return sources.get(name, rest) if sources else NOT_RECORDED

    rows = [{"option": name, "value": _text(read(spec)), "source": source(name)}
            for name, read in _SHOWN]
    shown = {name for name, _ in _SHOWN}
    inert = dict(masked(dict(spec.inert_settings)))
    for name in sorted((set(sources) | set(inert)) - shown - {"*"}):
        value = inert.get(name, "")
        rows.append({"option": name, "value": _text(MASK if is_secret_name(name) and value
                                                    else value), "source": source(name)})
    return rows
