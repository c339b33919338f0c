"""What SageMaker's framework containers carry, per ``framework_version``: facts, not code.

Each row is one container as its Dockerfiles and requirement files pin it (the framework's own
release, the container's Python, the packages a script relies on). shoal does not run the
container; it builds an environment that resolves as the container would, on the client's
Python. Sources: aws/sagemaker-scikit-learn-container (``docker/<version>/base/Dockerfile.cpu``,
``requirements.txt``, the per-version requirement checks), aws/deep-learning-containers and
sagemaker-python-sdk ``image_uri_config/pytorch.json`` (Python per PyTorch release), and
PyTorch's release notes (NumPy 2 support from torch 2.3). The table in
docs/sagemaker-compat.md is this one, for people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CONTAINERS", "Container", "container_for"]


@dataclass(frozen=True, slots=True)
class Container:
    """One framework container: *release* of *dist*, on *python*, with *pins* beside it.

    A pin is the container's exact version (``"1.19.2"``) or, where only an upper bound is
    known to matter, a specifier (``"<2"``: wheels built against NumPy 1 break on NumPy 2).
    """

    framework: str
    version: str
    dist: str
    release: str
    python: str | None
    pins: Mapping[str, str] = field(default_factory=dict)


def _sk(version: str, release: str, python: str | None, **pins: str) -> Container:
    return Container("sklearn", version, "scikit-learn", release, python,
                     {k.replace("_", "-"): v for k, v in pins.items()})


def _pt(version: str, python: str) -> Container:
    # torch wheels before 2.3 are built against NumPy 1: with NumPy 2 they fail to import it.
    major, minor = (int(p) for p in version.split(".")[:2])
    pins = {"numpy": "<2"} if (major, minor) < (2, 3) else {}
    return Container("pytorch", version, "torch", version, python, pins)


_SKLEARN = (
    _sk("0.20.0", "0.20.0", None, numpy="<2"),
    _sk("0.23-1", "0.23.2", "3.7", numpy="1.19.2", pandas="1.1.3", scipy="1.5.3",
        boto3="1.14.62"),
    _sk("1.0-1", "1.0.2", "3.7", numpy="1.19.5", pandas="1.1.3", scipy="1.5.3",
        boto3="1.16.4"),
    _sk("1.2-1", "1.2.1", "3.9", numpy="1.24.1", pandas="1.1.3", pyarrow="14.0.1"),
    _sk("1.4-2", "1.4.2", "3.10", numpy="2.1.0", pyarrow="17.0.0"),
    # pyarrow 14 is built against NumPy 1, so this container's NumPy is 1.x.
    _sk("1.5-2", "1.5.2", "3.10", numpy="<2", pyarrow="14.0.1"),
)
_PYTORCH = tuple(_pt(v, py) for v, py in (
    ("1.4.0", "3.6"), ("1.5.0", "3.6"), ("1.6.0", "3.6"), ("1.7.1", "3.6"), ("1.8.0", "3.6"),
    ("1.8.1", "3.6"), ("1.9.0", "3.8"), ("1.9.1", "3.8"), ("1.10.0", "3.8"), ("1.10.2", "3.8"),
    ("1.11.0", "3.8"), ("1.12.0", "3.8"), ("1.12.1", "3.8"), ("1.13.1", "3.9"),
    ("2.0.0", "3.10"), ("2.0.1", "3.10"), ("2.1.0", "3.10"), ("2.2.0", "3.10"),
    ("2.3.0", "3.11"), ("2.4.0", "3.11"), ("2.5.1", "3.11"), ("2.6.0", "3.12"),
    ("2.7.1", "3.12"),
))
CONTAINERS: Mapping[tuple[str, str], Container] = {
    (c.framework, c.version): c for c in (*_SKLEARN, *_PYTORCH)}
# SageMaker's short names for a container (image_uri_config's version_aliases).
_ALIASES = {("pytorch", "1.4"): "1.4.0", ("pytorch", "1.5"): "1.5.0", ("pytorch", "1.6"): "1.6.0",
            ("pytorch", "1.7"): "1.7.1", ("pytorch", "1.8"): "1.8.1", ("pytorch", "1.9"): "1.9.1",
            ("pytorch", "1.10"): "1.10.2", ("pytorch", "1.11"): "1.11.0",
            ("pytorch", "1.12"): "1.12.1", ("pytorch", "1.13"): "1.13.1",
            ("pytorch", "2.0"): "2.0.1", ("pytorch", "2.1"): "2.1.0", ("pytorch", "2.2"): "2.2.0",
            ("pytorch", "2.3"): "2.3.0", ("pytorch", "2.4"): "2.4.0", ("pytorch", "2.5"): "2.5.1",
            ("pytorch", "2.6"): "2.6.0", ("pytorch", "2.7"): "2.7.1",
            ("sklearn", "0.20"): "0.20.0", ("sklearn", "0.23"): "0.23-1",
            ("sklearn", "1.0"): "1.0-1", ("sklearn", "1.2"): "1.2-1",
            ("sklearn", "1.4"): "1.4-2", ("sklearn", "1.5"): "1.5-2"}


def container_for(framework: str, version: str) -> Container | None:
    """The container SageMaker runs for *framework* ``framework_version=version``, if known."""
    version = _ALIASES.get((framework, version), version)
    return CONTAINERS.get((framework, version))
