"""At SageMaker's path ``sagemaker.utils``: the resource-name helpers real code calls.

``name_from_base("xgboost")`` → ``xgboost-2024-11-30-12-00-00-123`` (millisecond timestamp,
at most 63 characters, SageMaker's format); ``unique_name_from_base`` adds a random suffix;
``base_name_from_image`` takes the repository name out of an image URI.

Example:
    >>> base_name_from_image("123.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1")
    'sagemaker-xgboost'
"""

from __future__ import annotations

import re
import secrets
import time

__all__ = ["base_from_name", "base_name_from_image", "name_from_base", "name_from_image",
           "sagemaker_short_timestamp", "sagemaker_timestamp", "unique_name_from_base"]

_IMAGE = re.compile(r"^(.+/)?([^:/]+)(:[^:]+)?$")
_TIMESTAMP_SUFFIX = re.compile(r"^(.+)-(\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}-\d{3}|\d{6}-\d{4})$")


def sagemaker_timestamp() -> str:
    """UTC now as ``YYYY-mm-dd-HH-MM-SS-mmm`` (SageMaker's resource-name timestamp)."""
    moment = time.time()
    millis = int(moment * 1000) % 1000
    return time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(moment)) + f"-{millis:03d}"


def sagemaker_short_timestamp() -> str:
    """Local now as ``yymmdd-HHMM`` (SageMaker's short form)."""
    return time.strftime("%y%m%d-%H%M")


def name_from_base(base: str, max_length: int = 63, short: bool = False) -> str:
    """*base* plus ``-<timestamp>``, *base* trimmed so the whole fits in *max_length*."""
    stamp = sagemaker_short_timestamp() if short else sagemaker_timestamp()
    return f"{base[:max_length - len(stamp) - 1]}-{stamp}"


def unique_name_from_base(base: str, max_length: int = 63) -> str:
    """*base* plus ``-<epoch seconds>-<4 hex digits>``, fitted into *max_length*."""
    unique = secrets.token_hex(2)
    stamp = str(int(time.time()))
    return f"{base[:max_length - 2 - len(stamp) - len(unique)]}-{stamp}-{unique}"


def base_name_from_image(image: str, default_base_name: str | None = None) -> str:
    """The repository part of an image URI (``registry/repo:tag`` → ``repo``)."""
    if not isinstance(image, str) or not image:
        return default_base_name or "base_name"
    match = _IMAGE.match(image)
    return match.group(2) if match else image


def name_from_image(image: str, max_length: int = 63) -> str:
    """``name_from_base(base_name_from_image(image))``."""
    return name_from_base(base_name_from_image(image), max_length=max_length)


def base_from_name(name: str) -> str:
    """The base of a name made by ``name_from_base`` (the timestamp taken off)."""
    match = _TIMESTAMP_SUFFIX.match(name)
    return match.group(1) if match else name
