"""A conda ``environment.yml``'s conda packages as PyPI requirements, for when no conda tool is
on PATH and uv builds the environment.

Three kinds of conda package:

- **Python packages**: on PyPI under the same name (``pandas``, ``numpy``, ``scikit-learn``) or
  under a known other one (``_PYPI_NAMES``: ``pytorch`` -> ``torch``, ``py-xgboost`` ->
  ``xgboost``, ``matplotlib-base`` -> ``matplotlib``, ...). Their conda version constraint
  becomes a PEP 440 one (``numpy=1.26`` -> ``numpy==1.26.*``).
- **System packages** (``SYSTEM_PACKAGES``): C and Fortran runtimes, compilers, BLAS/LAPACK,
  compression and TLS libraries, CUDA toolkits and conda's own meta-packages. On conda they
  provide what a PyPI wheel bundles or the machine (or container) already has: they are dropped,
  and the log says which.
- **No PyPI counterpart**: R packages (``r-*``) fail here, named; any other name is handed to
  uv as it is, and a name PyPI does not have fails the build naming it (``conda_name_error``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.errors import RuntimeEnvError

__all__ = ["SYSTEM_PACKAGES", "CondaAsPip", "conda_name_error", "conda_specifier",
           "conda_to_pip"]

# conda name -> PyPI name, where the two differ (conda-forge and defaults).
_PYPI_NAMES = {
    "pytorch": "torch", "pytorch-cpu": "torch", "pytorch-gpu": "torch",
    "py-xgboost": "xgboost", "py-xgboost-cpu": "xgboost", "py-xgboost-gpu": "xgboost",
    "py-lightgbm": "lightgbm", "matplotlib-base": "matplotlib", "numpy-base": "numpy",
    "pytables": "tables", "msgpack-python": "msgpack", "python-graphviz": "graphviz",
    "py-opencv": "opencv-python", "opencv": "opencv-python", "pyqt": "PyQt5",
    "ruamel_yaml": "ruamel.yaml", "faiss": "faiss-cpu", "faiss-gpu": "faiss-cpu",
    "tensorflow-base": "tensorflow", "pyarrow-core": "pyarrow", "arrow-cpp": "pyarrow",
    "libxgboost": "xgboost", "jupyter_client": "jupyter-client", "typing_extensions":
    "typing-extensions", "importlib_metadata": "importlib-metadata",
}
# What a conda environment needs from conda but a PyPI environment has from its wheels or from
# the machine: dropped (and said) when uv builds the file.
SYSTEM_PACKAGES = frozenset({
    "_libgcc_mutex", "_openmp_mutex", "libgcc", "libgcc-ng", "libstdcxx", "libstdcxx-ng",
    "libgomp", "libgfortran", "libgfortran-ng", "libgfortran5", "ld_impl_linux-64", "libffi",
    "libzlib", "zlib", "xz", "liblzma", "bzip2", "lz4-c", "zstd", "libuuid", "libnsl",
    "readline", "ncurses", "tk", "sqlite", "libsqlite", "openssl", "ca-certificates", "tzdata",
    "libedit", "libiconv", "icu", "libxml2", "yaml", "libyaml", "expat", "libexpat",
    "gcc", "gxx", "gfortran", "gcc_linux-64", "gxx_linux-64", "gfortran_linux-64", "compilers",
    "c-compiler", "cxx-compiler", "fortran-compiler", "make", "binutils", "sysroot_linux-64",
    "cudatoolkit", "cuda-toolkit", "cuda-version", "cuda-runtime", "cuda-nvcc", "cudnn", "nccl",
    "pytorch-cuda", "pytorch-mutex", "cpuonly", "blas", "libblas", "libcblas", "liblapack",
    "liblapacke", "openblas", "libopenblas", "mkl", "mkl-service", "intel-openmp",
    "llvm-openmp", "nomkl", "tbb",
})
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True, slots=True)
class CondaAsPip:
    """The conda packages of a file as PyPI requirements; *dropped* are its system packages,
    *renamed* the ``(conda name, PyPI name)`` pairs that differ."""

    requirements: tuple[str, ...]
    dropped: tuple[str, ...]
    renamed: tuple[tuple[str, str], ...]


def conda_specifier(constraint: str, *, what: str) -> str:
    """A conda version constraint as PEP 440 (``=1.26`` -> ``==1.26.*``; ``=1.26.4`` and
    ``1.26.4`` -> ``==1.26.4``; ``>=1.20,<2`` as it is; a build string is dropped)."""
    text = constraint.replace(" ", "")
    if not text:
        return ""
    if "|" in text or "[" in text:
        raise RuntimeEnvError(f"{what}{constraint}: conda's '|' and '[...]' version forms have "
                              "no PEP 440 equivalent shoal writes; give one version range")
    parts = []
    for part in text.split(","):
        if part.startswith("=") and not part.startswith("=="):
            part = part[1:]
        if part.startswith("=="):
            part = "==" + part[2:].split("=", 1)[0]
        elif part[:1].isdigit():
            version = part.split("=", 1)[0]
            exact = version.endswith("*") or version.count(".") >= 2
            part = f"=={version}" if exact else f"=={version}.*"
        parts.append(part)
    return ",".join(parts)


def conda_to_pip(packages: Sequence[str], *, source: str) -> CondaAsPip:
    """Translate the conda entries *packages* (``conda-forge::numpy=1.26``) for uv."""
    requirements, dropped, renamed, no_pypi = [], [], [], []
    for entry in packages:
        bare = entry.strip().split("::", 1)[-1]
        match = _NAME.match(bare)
        conda = (match.group(0) if match else bare).lower()
        constraint = bare[len(conda):].strip()
        if conda in SYSTEM_PACKAGES:
            dropped.append(entry.strip())
            continue
        if conda == "r" or conda.startswith("r-"):
            no_pypi.append(entry.strip())
            continue
        pypi = _PYPI_NAMES.get(conda, conda)
        if pypi != conda:
            renamed.append((conda, pypi))
        requirements.append(pypi + conda_specifier(constraint, what=f"{source}: {conda}"))
    if no_pypi:
        raise RuntimeEnvError(
            f"{source} needs conda for {', '.join(no_pypi)}: R packages have no PyPI "
            "counterpart, and no conda tool (micromamba, mamba or conda) is on PATH; install "
            "micromamba to build this file", path=source, conda_packages=no_pypi)
    return CondaAsPip(tuple(requirements), tuple(dropped), tuple(renamed))


def conda_name_error(message: str, translated: CondaAsPip, *, source: str) -> str | None:
    """The error to give when uv's *message* says a translated conda package is not on PyPI
    (it names the first one missing), or None when it says something else."""
    found = re.search(r"Because ([A-Za-z0-9._\-]+) was not found in the package registry",
                      message)
    if not found:
        return None
    name = found.group(1).lower()
    asked = {re.split(r"[<>=!~]", r, maxsplit=1)[0].lower(): r for r in translated.requirements}
    if name not in asked:
        return None
    conda = dict((p.lower(), c) for c, p in translated.renamed).get(name, name)
    return (f"{source}: conda package {conda!r} has no PyPI counterpart shoal knows (uv found "
            f"no {name!r} on the package index), and no conda tool (micromamba, mamba or conda) "
            "is on PATH; install micromamba, or replace it with its PyPI name in the file's "
            "pip: section")
