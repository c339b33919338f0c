"""Training inputs (data channels), under SageMaker's names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal._internal.extras import require_for_url
from shoal.core.inert import given
from shoal.errors import InvalidArgumentError

__all__ = ["TrainingInput", "check_input_mode", "resolve_channels"]

_INERT_INPUT = ("hub_access_config", "model_access_config", "shuffle_config", "instance_groups",
                "attribute_names", "target_attribute_name", "compression")

_CHANNEL_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class TrainingInput:
    """One data channel: where its data is and how the job sees it.

    ``s3_data`` takes a local path or any fsspec URL (``file://``, ``s3://``, ``gs://``...).
    Local data is linked into ``input/data/<channel>``; anything else is copied there before
    the script starts.
    """

    def __init__(self, s3_data: str | os.PathLike[str], distribution: str | None = None,
                 compression: str | None = None, content_type: str | None = None,
                 record_wrapping: str | None = None, s3_data_type: str = "S3Prefix",
                 instance_groups: Any = None, input_mode: str | None = None,
                 attribute_names: Any = None, target_attribute_name: Any = None,
                 shuffle_config: Any = None, hub_access_config: Mapping[str, Any] | None = None,
                 model_access_config: Mapping[str, Any] | None = None) -> None:
        self.s3_data = os.fspath(s3_data)
        self.distribution = distribution or "FullyReplicated"
        self.compression = compression
        self.content_type = content_type
        self.record_wrapping = record_wrapping
        self.s3_data_type = s3_data_type
        self.input_mode = check_input_mode(input_mode) if input_mode else None
        #: SageMaker settings with no effect here (JumpStart hub and EULA access, S3
        #: shuffling...): kept on the job record and reported once by ``fit()``.
        self.inert = given({"hub_access_config": hub_access_config,
                            "model_access_config": model_access_config,
                            "shuffle_config": shuffle_config, "instance_groups": instance_groups,
                            "attribute_names": attribute_names,
                            "target_attribute_name": target_attribute_name,
                            "compression": compression}, dict.fromkeys(_INERT_INPUT))
        self.config: dict[str, object] = {"DataSource": {"S3DataSource": {
            "S3DataType": s3_data_type, "S3Uri": self.s3_data,
            "S3DataDistributionType": self.distribution}}}
        if content_type:
            self.config["ContentType"] = content_type

    def __repr__(self) -> str:
        return f"TrainingInput({self.s3_data!r})"


def check_input_mode(mode: str) -> str:
    """SageMaker's ``input_mode``: "File" and "FastFile" (the data is staged before the script
    starts) work; "Pipe" (a FIFO stream) is not provided."""
    if mode not in ("File", "FastFile"):
        raise InvalidArgumentError(
            f"input_mode={mode!r} is not supported; use 'File' (the data is staged before the "
            "script starts) or 'FastFile'", argument="input_mode")
    return mode


def _as_uri(where: str) -> str:
    if "://" in where:
        return where
    return Path(where).expanduser().resolve().as_uri()


def resolve_channels(inputs: Any, input_mode: str = "File") -> dict[str, dict[str, Any]]:
    """``fit(inputs)`` → ``{channel: {"uri", ...}}``; every channel is checked to exist now.
    *input_mode* is the estimator's, for channels that do not set their own."""
    if inputs is None:
        return {}
    if isinstance(inputs, (str, os.PathLike, TrainingInput)):
        inputs = {"training": inputs}
    if not isinstance(inputs, dict):
        raise InvalidArgumentError(
            f"inputs must be a URI, a TrainingInput or a dict of channel name to either, got "
            f"{type(inputs).__name__}", argument="inputs")
    channels: dict[str, dict[str, Any]] = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name or set(name) - _CHANNEL_NAME_CHARS:
            raise InvalidArgumentError(f"channel name {name!r} is invalid: use letters, digits, "
                                       "'-', '_' or '.'", channel=str(name))
        ti = value if isinstance(value, TrainingInput) else None
        where = ti.s3_data if ti is not None else value
        if not isinstance(where, (str, os.PathLike)):
            raise InvalidArgumentError(f"channel {name!r}: expected a URI or TrainingInput, got "
                                       f"{type(where).__name__}", channel=name)
        uri = _as_uri(os.fspath(where))
        _check_exists(name, uri)
        channels[name] = {
            "uri": uri, "content_type": ti.content_type if ti else None,
            "input_mode": (ti.input_mode if ti else None) or input_mode,
            "distribution": ti.distribution if ti else "FullyReplicated",
            "record_wrapping": ti.record_wrapping if ti else None,
        }
        if ti is not None and ti.inert:
            channels[name]["inert"] = dict(ti.inert)
    return channels


def _check_exists(name: str, uri: str) -> None:
    import fsspec.core

    require_for_url(uri, f"channel {name!r} ({uri})")
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        fs.invalidate_cache(path)
        found = fs.exists(path)
    except (ImportError, ValueError) as e:
        raise InvalidArgumentError(f"channel {name!r}: cannot open {uri}: {e}. For s3:// "
                                   "install shoal[s3].", channel=name, uri=uri) from e
    except OSError as e:
        raise InvalidArgumentError(f"channel {name!r}: cannot reach {uri}: {e}", channel=name,
                                   uri=uri) from e
    if not found:
        raise InvalidArgumentError(f"channel {name!r}: {uri} does not exist; nothing was "
                                   "started", channel=name, uri=uri)
