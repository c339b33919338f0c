"""``build_bundle``: a model in, a self-contained deployment bundle for one platform out.

A bundle is a directory or a ``.zip``: ``model/`` (``model.onnx``, ``bundle.json``,
``samples.npz``), the target's entry module (the runtime inlined), ``requirements.txt``,
``README.md``, ``sample.json`` and the target's own files. It never imports shoal.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.extras import require
from shoal.bundles import _render
from shoal.bundles._model import (
    Parity,
    TensorInfo,
    compare,
    describe,
    float_weight_bytes,
    make_samples,
    mapped_output,
    quantize_weights,
    run_onnx,
)
from shoal.bundles._options import (
    SIZE_LIMITS,
    BundleOptions,
    BundleTarget,
    ModelType,
    OutputMap,
    parse_target,
)
from shoal.bundles._source import SourceModel, fetch, load
from shoal.errors import AlreadyExistsError, InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np

    from shoal.session import Session

__all__ = ["BundleRecord", "BundleWarning", "build_bundle", "check_size"]

#: int8 weights by default once the float32 Conv/Gemm/MatMul weights reach this size.
AUTO_QUANTIZE_BYTES = 1024 * 1024
#: Below this share of equal predictions the int8 weights earn a warning at build time.
MIN_AGREEMENT = 0.95
PARITY_SAMPLES = 256  # random inputs; given samples: up to MAX_GIVEN_SAMPLES
MAX_GIVEN_SAMPLES = 4096
STORED_SAMPLES = 32  # kept in model/samples.npz for 'shoal bundle verify'
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed: a zip's bytes depend on its files only
_PROBE_BYTES = 1 << 20
_TYPE_NAMES = {"onnx": "ONNX", "scikit-learn": "scikit-learn (converted to ONNX)"}
_GENERIC_NAMES = {"model", "models", "output", "ml", "opt", "unpacked", "download", "tmp"}


class BundleWarning(UserWarning):
    """A bundle was built but something about it needs a person's attention (size, parity)."""


@dataclass(frozen=True, slots=True)
class BundleRecord:
    """What ``build_bundle`` made (its ``bundle.json`` holds the same facts)."""

    path: Path
    target: BundleTarget
    name: str
    model_type: ModelType
    source: str
    weights: str          # "float32" or "int8"
    parity: Parity        # the bundled model against the source, on the samples
    size_bytes: int       # the files, unzipped
    zipped_bytes: int     # as a .zip (what is uploaded)
    files: tuple[str, ...]
    requirements: tuple[str, ...]
    warnings: tuple[str, ...]
    seconds: float


BUNDLE_MODULES = ("numpy", "onnx", "onnxruntime")


def build_bundle(model: str | os.PathLike[str], *, target: BundleTarget | str,
                 output: str | os.PathLike[str], force: bool = False,
                 session: Session | None = None,
                 **options: Any) -> BundleRecord:
    """Build a deployment bundle of *model* for *target* at *output* (a directory or a .zip).

    Args:
        model: a model directory or file (``model.onnx``, ``model.joblib``), a
            ``model.tar.gz`` path or URI, or the name of a completed training job.
        target: ``azure-functions``, ``aws-lambda``, ``container`` or ``asgi``.
        output: where the bundle goes; ``*.zip`` makes an archive. An existing one is replaced
            only with ``force=True``.
        session: the session that resolves job names and artifact URIs (default: current).
        **options: ``BundleOptions`` fields (``route``, ``auth_level``, ``output_map``,
            ``output_key``, ``quantize``, ``samples``).

    Example:
        >>> build_bundle("model/", target="azure-functions", output="mnist.zip")  # doctest: +SKIP
    """
    require("bundle", "shoal bundle build", *BUNDLE_MODULES)
    started = time.monotonic()
    bundle_target = parse_target(target)
    opts = BundleOptions.of(bundle_target, **options)
    out = Path(output).expanduser().absolute()
    _check_output(out, force=force)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-bundle-") as tmp:
        work = Path(tmp)
        origin = os.fspath(model)
        source = load(fetch(model, workdir=work / "source", session=session), origin=origin,
                      target=bundle_target)
        stage = work / "bundle"
        name = _name_of(origin)
        manifest, parity = _prepare_model(source, opts, stage / "model", bundle_target, name,
                                          notes)
        reqs = _render.requirements(bundle_target)
        _write_files(bundle_target, stage, manifest, opts, reqs)
        files = tuple(sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*")
                             if p.is_file()))
        size = sum((stage / f).stat().st_size for f in files)
        archive = _zip(stage, files, work / "bundle.zip")
        zipped = archive.stat().st_size
        _publish(archive if out.suffix == ".zip" else stage, out)
    notes += check_size(bundle_target, zipped_bytes=zipped, unzipped_bytes=size,
                        what="the bundle")
    for note in notes:
        warnings.warn(note, BundleWarning, stacklevel=2)
    return BundleRecord(out, bundle_target, name, source.type, source.origin,
                        manifest["weights"], parity, size, zipped, files, tuple(reqs),
                        tuple(notes), time.monotonic() - started)


def check_size(target: BundleTarget, *, zipped_bytes: int | None, unzipped_bytes: int,
               what: str) -> list[str]:
    """Warnings for sizes over *target*'s documented limits (``SIZE_LIMITS``), with numbers."""
    limit = SIZE_LIMITS.get(target)
    if limit is None:
        return []
    out = []
    if limit.zipped_bytes and zipped_bytes is not None and zipped_bytes > limit.zipped_bytes:
        out.append(f"{what} is {zipped_bytes / 1e6:.1f} MB zipped, over the "
                   f"{limit.zipped_bytes / 1e6:.0f} MB limit: {limit.what} ({limit.source})")
    if limit.unzipped_bytes and unzipped_bytes > limit.unzipped_bytes:
        out.append(f"{what} is {unzipped_bytes / 1e6:.1f} MB unzipped, over the "
                   f"{limit.unzipped_bytes / 1e6:.0f} MB limit: {limit.what} ({limit.source})")
    return out


# --- the model directory ------------------------------------------------------------------

def _prepare_model(source: SourceModel, opts: BundleOptions, model_dir: Path,
                   target: BundleTarget, name: str,
                   notes: list[str]) -> tuple[dict[str, Any], Parity]:
    import numpy as np
    import onnx

    inputs, outputs = describe(source.onnx)
    output_map = opts.output_map or _default_map(outputs)
    mapped = mapped_output(outputs, output_map)
    if mapped is None:
        shapes = ", ".join(f"{o.name} {list(o.shape or [])}" for o in outputs)
        raise InvalidArgumentError(f"output_map 'argmax' needs a 2-D output (samples × "
                                   f"classes); this model's outputs are {shapes}; use "
                                   "output_map='identity'", output_map=str(output_map))
    feeds = (_load_samples(opts.samples, inputs) if opts.samples is not None
             else make_samples(inputs, PARITY_SAMPLES))
    reference = source.reference(feeds) if source.reference else run_onnx(source.onnx, feeds)
    bundled, weights = _maybe_quantize(onnx.load_from_string(source.onnx), opts, notes)
    got = run_onnx(bundled, feeds, int8=weights == "int8")
    argmax = output_map == OutputMap.ARGMAX
    parity = compare(reference, got, mapped=mapped, argmax=argmax)
    if weights == "int8" and parity.agreement is not None and parity.agreement < MIN_AGREEMENT:
        notes.append(f"with int8 weights {parity.agreement:.1%} of {parity.samples} predictions "
                     "match the source model; rebuild with quantize=False (--no-quantize)")
    model_dir.mkdir(parents=True)
    (model_dir / "model.onnx").write_bytes(bundled)
    kept = {f"input:{k}": v[:STORED_SAMPLES] for k, v in feeds.items()}
    kept |= {f"source:{k}": _storable(v[:STORED_SAMPLES]) for k, v in reference.items()}
    kept |= {f"bundle:{k}": _storable(v[:STORED_SAMPLES]) for k, v in got.items()}
    # mypy matches **kept against savez_compressed's allow_pickle: bool keyword too
    np.savez_compressed(model_dir / "samples.npz", **kept)  # type: ignore[arg-type]
    manifest = {
        "format": 1, "name": name, "target": target.value, "model_file": "model.onnx",
        "inputs": [i.to_json() for i in inputs], "outputs": [o.to_json() for o in outputs],
        "output_map": output_map.value, "mapped_output": mapped,
        "output_key": opts.output_key or ("digits" if argmax else "predictions"),
        "route": opts.route, "auth_level": opts.auth_level.value if opts.auth_level else None,
        "weights": weights,
        "source": {"model": source.origin, "type": source.type.value,
                   "file": source.file.name},
        "parity": {**parity.to_json(), "inputs": "given" if opts.samples else "random"},
        "built_with": {"shoal": _version("shoal"), "python": _render.python_version(),
                       "onnxruntime": _version("onnxruntime"), "numpy": _version("numpy")},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (model_dir / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n",
                                           encoding="utf-8")
    return manifest, parity


def _default_map(outputs: list[TensorInfo]) -> OutputMap:
    """argmax for scores over classes (a float output [N, C>1]); the output itself otherwise."""
    first = outputs[0] if outputs else None
    if (first is not None and first.dtype.startswith("float") and first.shape is not None
            and len(first.shape) == 2 and (first.shape[1] or 0) > 1):
        return OutputMap.ARGMAX
    return OutputMap.IDENTITY


def _maybe_quantize(proto: Any, opts: BundleOptions, notes: list[str]) -> tuple[bytes, str]:
    want = opts.quantize
    if want is None:
        want = float_weight_bytes(proto) >= AUTO_QUANTIZE_BYTES
    if want:
        quantized, converted, why = quantize_weights(proto)
        if converted:
            return quantized.SerializeToString(), "int8"
        if opts.quantize:  # asked for explicitly: say why it did not happen
            notes.append(f"weights kept as float32: {why}")
    return proto.SerializeToString(), "float32"


def _load_samples(path: Path, inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    import numpy as np

    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"cannot read samples from {path}: {e}",
                                   path=str(path)) from e
    if isinstance(loaded, np.ndarray):
        if len(inputs) != 1:
            raise InvalidArgumentError(f"the model has {len(inputs)} inputs; pass samples as "
                                       "an .npz file with one array per input name")
        arrays = {inputs[0].name: loaded}
    else:
        with loaded:
            arrays = {k: loaded[k] for k in loaded.files}
        if len(inputs) == 1 and inputs[0].name not in arrays and len(arrays) == 1:
            arrays = {inputs[0].name: next(iter(arrays.values()))}
    feeds = {}
    for spec in inputs:
        if spec.name not in arrays:
            raise InvalidArgumentError(f"samples in {path} lack input {spec.name!r}")
        array = np.asarray(arrays[spec.name]).astype(spec.dtype if spec.dtype != "string"
                                                     else object)
        sample = spec.shape[1:] if spec.shape else ()
        if sample and all(isinstance(d, int) for d in sample):
            array = array.reshape(-1, *sample)
        feeds[spec.name] = array[:MAX_GIVEN_SAMPLES]
    return feeds


def _storable(value: Any) -> Any:
    import numpy as np

    array = np.asarray(value)
    return array.astype(str) if array.dtype == object else array  # no pickles in the npz


# --- the other files ----------------------------------------------------------------------

def _write_files(target: BundleTarget, stage: Path, manifest: dict[str, Any],
                 opts: BundleOptions, reqs: list[str]) -> None:
    import numpy as np

    header = (f"Generated by shoal bundle build (shoal {manifest['built_with']['shoal']}) for "
              f"{target} from {manifest['source']['model']}.\nNeeds only requirements.txt.")
    entry = _render.entry_module(target, route=opts.route, auth_level=opts.auth_level,
                                 header=header)
    compile(entry, _render.ENTRY_FILES[target], "exec")  # a broken template fails the build
    (stage / _render.ENTRY_FILES[target]).write_text(entry, encoding="utf-8")
    (stage / "requirements.txt").write_text(
        f"# {target} bundle: numpy and onnxruntime pinned to the versions it was built and "
        "checked with.\n" + "\n".join(reqs) + "\n", encoding="utf-8")
    for extra in _render.EXTRA_FILES.get(target, ()):
        (stage / extra).write_text(_render.static_file(target, extra), encoding="utf-8")
    with np.load(stage / "model" / "samples.npz") as samples:
        first = {k.split(":", 1)[1]: samples[k][0] for k in samples.files
                 if k.startswith("input:")}
    data = next(iter(first.values())) if len(first) == 1 else first
    (stage / "sample.json").write_text(json.dumps({"data": _rounded(data)}) + "\n",
                                       encoding="utf-8")
    (stage / "README.md").write_text(_render.readme(target, _readme_values(manifest)),
                                     encoding="utf-8")


def _rounded(value: Any) -> Any:
    import numpy as np

    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    array = np.asarray(value)
    # float64 first: float32 values would print as 0.6370000243186951
    return np.round(array.astype(np.float64), 4).tolist() if array.dtype.kind == "f" \
        else array.tolist()


def _readme_values(manifest: dict[str, Any]) -> dict[str, Any]:
    parity = manifest["parity"]
    if manifest["weights"] == "int8":
        checked = (f"Weights stored as int8 (one scale per output channel; computed in float32): "
                   f"on {parity['samples']} {parity['inputs']} inputs "
                   + (f"{parity['agreement']:.1%} of the predictions match the source model, "
                      if parity["agreement"] is not None else "")
                   + f"largest output difference {parity['max_abs_diff']:.2g}.")
    else:
        checked = (f"Weights as in the source (float32); largest output difference from it on "
                   f"{parity['samples']} {parity['inputs']} inputs: "
                   f"{parity['max_abs_diff'] or 0:.2g}.")
    first = manifest["inputs"][0]
    shape = ", ".join(str(d) if d is not None else "N" for d in first["shape"] or [])
    return {
        "name": manifest["name"], "route": manifest["route"],
        "model_file": manifest["model_file"], "output_key": manifest["output_key"],
        "auth_level": manifest["auth_level"] or "",
        "summary": (f"Built by shoal {manifest['built_with']['shoal']} on "
                    f"{manifest['created_at']} from `{manifest['source']['model']}` (an "
                    f"{_TYPE_NAMES[manifest['source']['type']]} model). {checked} Check it end "
                    "to end with "
                    "`shoal bundle verify <this bundle>`."),
        "input_desc": f"`{first['name']}`, {first['dtype']} [{shape}]",
        "output_desc": (f"the class index of `{manifest['mapped_output']}`"
                        if manifest["output_map"] == "argmax"
                        else f"the values of `{manifest['mapped_output']}`"),
    }


# --- output -------------------------------------------------------------------------------

def _check_output(out: Path, *, force: bool) -> None:
    if not out.exists():
        if not out.parent.is_dir():
            raise InvalidArgumentError(f"cannot write {out}: {out.parent} is not a directory",
                                       path=str(out))
        return
    if not force:
        raise AlreadyExistsError(f"{out} exists; pass --force (force=True) to replace it",
                                 path=str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / "model" / "bundle.json").is_file():
        raise InvalidArgumentError(f"{out} is a directory that is not a shoal bundle; "
                                   "refusing to replace it, even with --force", path=str(out))


def _zip(stage: Path, files: tuple[str, ...], archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as zf:
        for name in files:
            data = (stage / name).read_bytes()
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = _compression(data)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data, compresslevel=6)
    return archive


def _compression(data: bytes) -> int:
    """Stored for what deflate cannot shrink (float or int8 weights are close to noise):
    deflating a large model costs seconds and saves a few percent at most."""
    probe = data[len(data) // 2:len(data) // 2 + _PROBE_BYTES]
    if len(data) > _PROBE_BYTES and len(zlib.compress(probe, 1)) > 0.95 * len(probe):
        return zipfile.ZIP_STORED
    return zipfile.ZIP_DEFLATED


def _publish(built: Path, out: Path) -> None:
    """Move *built* to *out*, replacing what is there (checked by ``_check_output``)."""
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        if built.is_dir():
            shutil.copytree(built, tmp)
        else:
            shutil.copyfile(built, tmp)
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        elif out.exists() and built.is_dir():
            out.unlink()
        os.replace(tmp, out)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _name_of(origin: str) -> str:
    parts = [p for p in re.split(r"[/\\:]+", origin) if p]
    for part in reversed(parts):
        stem = re.sub(r"(\.tar\.gz|\.tgz|\.tar|\.onnx|\.joblib|\.pkl|\.zip)$", "", part)
        if stem.lower() not in _GENERIC_NAMES and stem not in ("", ".", ".."):
            return re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40] or "model"
    return "model"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"
