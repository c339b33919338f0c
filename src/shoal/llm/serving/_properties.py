"""``LlmServingOptions``: DJL's ``serving.properties`` (and its ``OPTION_*`` / ``SERVING_*``
environment overrides) parsed and validated once, before the server listens.

Where the model behind ``option.model_id`` is found (a directory, an fsspec URI, a hub id from
the local cache) is decided at load time by ``locate_model``; nothing here does I/O besides
reading the properties file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from shoal.errors import ModelLoadError
from shoal.llm._hub import from_hub_cache, looks_like_hub_id
from shoal.llm._serving import read_serving_properties
from shoal.llm.serving._lmi import (
    ASYNC_HANDLERS,
    BUILTIN_HANDLERS,
    NON_LLM_HANDLERS,
    VLLM_HANDLERS,
    KeptKey,
    builtin_handler,
    kept_reason,
    lmi_notes,
)

__all__ = ["Engine", "LlmServingOptions", "LocatedModel", "Quantize", "RollingBatch", "find_properties",
           "load_serving_options", "locate_model"]

log = logging.getLogger(__name__)

PROPERTIES = "serving.properties"
#: DJL's model path inside a SageMaker container; the fine-tuning recipe writes it.
_SAGEMAKER_MODEL_DIR = "/opt/ml/model"


class Engine(StrEnum):
    """DJL's ``engine=`` values for LLMs (every one runs shoal's engine), and shoal's own."""

    PYTHON = "python"            # DJL's default for LMI
    MPI = "mpi"                  # DJL's multi-GPU (lmi-dist, TensorRT-LLM) launcher
    DEEPSPEED = "deepspeed"      # DJL's DeepSpeed engine (older LMI releases)
    FASTERTRANSFORMER = "fastertransformer"  # older LMI releases
    TRANSFORMERS = "transformers"  # shoal's name for its own engine
    VLLM = "vllm"                # shoal's: vLLM's engine, which must be installed


class RollingBatch(StrEnum):
    """LMI's ``option.rolling_batch`` values: the inference library DJL would batch with.
    All but ``disable`` run shoal's continuous batching (``vllm``: vLLM's engine when the
    package is installed)."""

    AUTO = "auto"
    DISABLE = "disable"  # no rolling batch: up to option.batch_size requests at a time (1)
    VLLM = "vllm"
    LMI_DIST = "lmi-dist"
    LMI_DIST_V2 = "lmi-dist-v2"
    SCHEDULER = "scheduler"
    DEEPSPEED = "deepspeed"
    TRTLLM = "trtllm"
    TENSORRTLLM = "tensorrtllm"
    TNX = "tnx"


class Quantize(StrEnum):
    BITSANDBYTES4 = "bitsandbytes4"
    BITSANDBYTES8 = "bitsandbytes8"


_QUANTIZE_ALIASES = {"bitsandbytes": Quantize.BITSANDBYTES8, "bitsandbytes8": Quantize.BITSANDBYTES8,
                     "bnb8": Quantize.BITSANDBYTES8, "bitsandbytes4": Quantize.BITSANDBYTES4,
                     "bnb4": Quantize.BITSANDBYTES4, "nf4": Quantize.BITSANDBYTES4}
_DTYPES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
           "bf16": "bfloat16", "bfloat16": "bfloat16", "auto": "auto"}
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}

#: Lower-cased key → field. ``option.n_positions`` is DJL's older name for the length limit.
_KEYS: dict[str, str] = {
    "engine": "engine",
    "job_queue_size": "job_queue_size",
    "option.model_id": "model_id",
    "option.tensor_parallel_degree": "tensor_parallel_degree",
    "option.dtype": "dtype",
    "option.max_rolling_batch_size": "max_rolling_batch_size",
    "option.rolling_batch": "rolling_batch",
    "option.n_positions": "max_model_len",
    "option.max_model_len": "max_model_len",
    "option.trust_remote_code": "trust_remote_code",
    "option.quantize": "quantize",
    "option.entrypoint": "entry_point",
    "option.model_loading_timeout": "model_loading_timeout",
    "option.tgi_compat": "tgi_compat",
    "option.return_full_text": "return_full_text",
    "option.batch_size": "djl_batch_size",
    "option.shoal_strict": "strict",
    "option.shoal_engine_process": "engine_process",
}
#: the DJL engines that serve something other than an LLM through Python
_NON_LLM_ENGINES = ("pytorch", "mxnet", "tensorflow", "onnxruntime", "onnx", "paddlepaddle",
                    "tensorrt", "xgboost", "lightgbm", "tflite", "tokenizers", "rust")


@dataclass(frozen=True, slots=True)
class LlmServingOptions:
    """How an LLM is loaded and served, from ``serving.properties``.

    Attributes:
        base_dir: the directory holding ``serving.properties`` (relative model ids start here).
        engine: ``Python``/``MPI``/``DeepSpeed``/``FasterTransformer``/``transformers``
            (shoal's transformers engine) or ``vllm`` (vLLM's, which must be installed).
        model_id: a directory, an fsspec URI, or a hub id from the local cache; ``None``: the
            model beside ``serving.properties``.
        tensor_parallel_degree: GPUs to spread the model over (``None``: ``max``, all there are).
        dtype: torch dtype name, or ``auto`` (the checkpoint's).
        max_rolling_batch_size: sequences decoded together (when set; else
            ``option.batch_size``, else 32).
        rolling_batch: the LMI value; every one but ``disable`` is continuous batching.
        max_model_len: prompt + generated tokens per sequence (``None``: the model's limit).
        quantize: bitsandbytes 4 or 8 bit at load.
        entry_point: a custom ``model.py`` handler (a file), served by its own app.
        handler: a built-in ``djl_python.*`` handler's name (served by shoal's engine).
        djl_batch_size: ``option.batch_size`` (the batch limit when
            ``max_rolling_batch_size`` is not set).
        strict: ``option.shoal_strict``: what would run differently from the file as
            written (keys with no effect, too few devices, another dtype) fails the load.
        engine_process: ``option.shoal_engine_process``: the transformers engine runs in a
            process of its own, so HTTP and the model's forward do not share one GIL
            (``None``: when this process may use two CPUs or more; see ``uses_engine_process``).
        model_loading_timeout: seconds the load may take before the server gives up.
        job_queue_size: requests waiting for a batch slot before 503.
        tgi_compat: LMI's ``option.tgi_compat``: ``/invocations`` answers as Hugging Face's
            TGI container does (a one-element list, TGI's ``details``, SSE when streaming)
            instead of LMI's object; ``HuggingFaceModel`` sets it.
        return_full_text: shoal's ``option.return_full_text``: the default of a request's
            ``parameters.return_full_text`` on ``/invocations`` and ``/`` (TGI's container
            answers a text-generation model with the prompt prepended unless told not to);
            ``HuggingFaceModel`` sets it with ``tgi_compat``.
        unknown: keys this server does not know (reported once at load; with an entry point,
            unknown ``option.*`` keys are the handler's own and are passed to it).
        kept: DJL/LMI keys accepted with no effect here (Neuron's compiler settings, DJL's
            worker settings), with why.
        notes: what the server says once at start: which engine serves the file, the
            unknown and kept keys.
        properties: every key as written (or as an environment variable set it) and its
            value, for an entry point's ``handle()``.
        sources: where each set field came from (``serving.properties`` or a variable).

    Example::

        opts = load_serving_options(Path("model/"), {"OPTION_DTYPE": "fp32"})
    """

    base_dir: Path
    engine: Engine = Engine.PYTHON
    model_id: str | None = None
    tensor_parallel_degree: int | None = None
    dtype: str = "auto"
    max_rolling_batch_size: int = 32
    rolling_batch: RollingBatch = RollingBatch.AUTO
    max_model_len: int | None = None
    trust_remote_code: bool = False
    quantize: Quantize | None = None
    entry_point: str | None = None
    handler: str | None = None
    djl_batch_size: int | None = None
    strict: bool = False
    engine_process: bool | None = None
    model_loading_timeout: float = 1800.0
    job_queue_size: int = 1000
    tgi_compat: bool = False
    return_full_text: bool = False
    unknown: tuple[str, ...] = ()
    kept: tuple[KeptKey, ...] = ()
    notes: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def ignored(self) -> tuple[str, ...]:
        """The unknown keys nothing reads: with a custom entry point, its handler receives
        the ``option.*`` ones."""
        if self.entry_point:
            return tuple(k for k in self.unknown if not k.lower().startswith("option."))
        return self.unknown

    @property
    def wants_vllm(self) -> bool:
        """vLLM asked for: ``engine=vllm`` (required), ``option.rolling_batch=vllm`` or a
        vLLM handler (used when installed)."""
        return (self.engine is Engine.VLLM or self.rolling_batch is RollingBatch.VLLM
                or self.handler in VLLM_HANDLERS)

    @property
    def uses_engine_process(self) -> bool:
        """Whether the transformers engine runs in a process of its own: as
        ``option.shoal_engine_process`` says, else when this process may use two CPUs or more
        (with one, the two processes would only take turns)."""
        if self.engine_process is not None:
            return self.engine_process
        try:
            return len(os.sched_getaffinity(0)) >= 2
        except AttributeError:  # no affinity masks (macOS)
            return (os.cpu_count() or 1) >= 2

    @property
    def requires_vllm(self) -> bool:
        return self.engine is Engine.VLLM

    @property
    def batch_size(self) -> int:
        """Sequences decoded together: ``max_rolling_batch_size`` when set, else
        ``option.batch_size``, else 32; with ``option.rolling_batch=disable`` (and no async
        service handler, which batches on its own) ``option.batch_size`` or 1."""
        if self.rolling_batch is RollingBatch.DISABLE and self.handler not in ASYNC_HANDLERS:
            return self.djl_batch_size or 1
        if "max_rolling_batch_size" in self.sources or self.djl_batch_size is None:
            return self.max_rolling_batch_size
        return self.djl_batch_size


def find_properties(model: str | os.PathLike[str]) -> Path | None:
    """``serving.properties`` for *model* (the file itself, or one inside the directory)."""
    path = Path(os.fspath(model))
    if path.name == PROPERTIES and path.is_file():
        return path
    candidate = path / PROPERTIES
    return candidate if candidate.is_file() else None


def load_serving_options(path: Path, environ: Mapping[str, str]) -> LlmServingOptions:
    """Options from ``serving.properties`` at *path* (a file or its directory), overridden by
    DJL's variables in *environ*: ``OPTION_<NAME>`` sets ``option.<name>``, ``SERVING_<NAME>``
    sets ``<name>``, ``HF_MODEL_ID`` sets ``option.model_id``.

    Raises ``ModelLoadError`` naming the key and the value that is wrong.
    """
    source = path if path.is_file() else path / PROPERTIES
    raw: dict[str, tuple[str, str, str]] = {}  # lower key → (key as written, value, source)
    if source.is_file():
        for key, value in read_serving_properties(source).items():
            raw[key.lower()] = (key, value, str(source))
    for var, value in sorted(environ.items()):
        if var.startswith("OPTION_"):
            key = "option." + var.removeprefix("OPTION_").lower()
        elif var.startswith("SERVING_"):
            key = var.removeprefix("SERVING_").lower()
        elif var == "HF_MODEL_ID":
            key = "option.model_id"
        else:
            continue
        raw[key] = (key, value, f"${var}")
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    unknown: list[str] = []
    kept: list[KeptKey] = []
    for lower, (key, value, origin) in raw.items():
        name = _KEYS.get(lower)
        if name is not None:
            values[name] = _convert(name, key, value.strip(), origin)
            sources[name] = origin
        elif (reason := kept_reason(lower)) is not None:
            _check_kept(lower, key, value.strip(), origin)
            kept.append(KeptKey(key, value, reason))
        else:
            unknown.append(key)
    _split_entry_point(values, sources)
    options = LlmServingOptions(base_dir=source.parent.resolve(),
                                unknown=tuple(sorted(unknown)),
                                kept=tuple(sorted(kept, key=lambda k: k.key.lower())),
                                sources=sources, properties={k: v for k, v, _ in raw.values()},
                                **values)  # type: ignore[arg-type]  # _convert gave each the type of its field, by name
    if options.strict:
        _refuse_in_strict_mode(options, source)
    notes = lmi_notes(options, source)
    for level, note in notes:
        log.log(level, "%s", note)
    return replace(options, notes=tuple(note for _, note in notes))


def _split_entry_point(values: dict[str, object], sources: dict[str, str]) -> None:
    """``option.entryPoint`` naming a built-in ``djl_python.*`` handler is not a file: it moves
    to ``handler`` (a non-LLM or unknown built-in one fails, naming the key)."""
    value = values.get("entry_point")
    if not isinstance(value, str):
        return
    handler = builtin_handler(value)
    if handler is None:
        return
    origin = sources.pop("entry_point")
    del values["entry_point"]
    if handler in NON_LLM_HANDLERS:
        raise _bad("option.entryPoint", value, origin,
                   f"an LLM handler: {handler} serves {NON_LLM_HANDLERS[handler]}, which this "
                   f"LLM server does not; give one of {', '.join(BUILTIN_HANDLERS)} or a "
                   f"model.py of your own")
    if handler not in BUILTIN_HANDLERS:
        raise _bad("option.entryPoint", value, origin,
                   f"one of DJL's built-in LLM handlers ({', '.join(BUILTIN_HANDLERS)}) or a "
                   f"Python file (model.py) beside serving.properties")
    values["handler"] = handler
    sources["handler"] = origin


def _check_kept(lower: str, key: str, value: str, origin: str) -> None:
    """A kept key's value is still checked where DJL would refuse it."""
    if lower == "option.neuron_optimize_level" and value not in ("1", "2", "3"):
        raise _bad(key, value, origin, "1, 2 or 3 (the Neuron compiler's -O level)")


def _refuse_in_strict_mode(options: LlmServingOptions, source: Path) -> None:
    """``option.shoal_strict=true``: a key that would have no effect fails the load."""
    ignored = [*options.ignored, *(k.key for k in options.kept)]
    if ignored:
        raise ModelLoadError(f"{source}: option.shoal_strict=true and these keys would have no "
                             f"effect here: {', '.join(ignored)}; remove them, or set "
                             f"option.shoal_strict=false to serve with them ignored",
                             key=ignored[0], source=str(source))


def _bad(key: str, value: str, origin: str, expected: str) -> ModelLoadError:
    return ModelLoadError(f"{origin}: {key}={value!r} is not valid: expected {expected}",
                          key=key, value=value, source=origin)


def _convert(name: str, key: str, value: str, origin: str) -> object:
    low = value.lower()
    if name == "engine":
        try:
            return Engine(low)
        except ValueError:
            hint = (f" ({value} is DJL's engine for {value} models, not LLMs; serve those "
                    f"without serving.properties)" if low in _NON_LLM_ENGINES else "")
            raise _bad(key, value, origin, "Python, MPI, DeepSpeed, FasterTransformer, "
                       "transformers or vllm" + hint) from None
    if name == "rolling_batch":
        try:
            return RollingBatch(low)
        except ValueError:
            raise _bad(key, value, origin, ", ".join(r.value for r in RollingBatch)) from None
    if name == "dtype":
        if low not in _DTYPES:
            raise _bad(key, value, origin, "fp32, fp16, bf16 or auto")
        return _DTYPES[low]
    if name == "quantize":
        if low not in _QUANTIZE_ALIASES:
            raise _bad(key, value, origin, "bitsandbytes4 or bitsandbytes8 (bitsandbytes)")
        return _QUANTIZE_ALIASES[low]
    if name in ("trust_remote_code", "tgi_compat", "return_full_text", "strict",
                "engine_process"):
        if low not in _BOOLS:
            raise _bad(key, value, origin, "true or false")
        return _BOOLS[low]
    if name == "tensor_parallel_degree":
        if low == "max":
            return None
        return _positive_int(key, value, origin, "a GPU count >= 1 or max")
    if name in ("max_rolling_batch_size", "max_model_len", "job_queue_size",
                "djl_batch_size"):
        return _positive_int(key, value, origin, "an integer >= 1")
    if name == "model_loading_timeout":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise _bad(key, value, origin, "a number of seconds > 0")
        return seconds
    if not value:
        raise _bad(key, value, origin, "a non-empty value")
    return value


def _positive_int(key: str, value: str, origin: str, expected: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise _bad(key, value, origin, expected) from None
    if number < 1:
        raise _bad(key, value, origin, expected)
    return number


@dataclass(frozen=True, slots=True)
class LocatedModel:
    """A local model directory; ``cleanup`` removes a fetched copy."""

    path: Path
    cleanup_dir: Path | None = None

    def cleanup(self) -> None:
        if self.cleanup_dir is not None:
            import shutil

            shutil.rmtree(self.cleanup_dir, ignore_errors=True)


def locate_model(options: LlmServingOptions) -> LocatedModel:
    """The local directory of the model ``option.model_id`` names.

    Looks, in order: beside ``serving.properties`` (no model id, or DJL's ``/opt/ml/model``
    when that does not exist here); a local path (relative to ``serving.properties``); an
    fsspec URI (fetched); a local ``model.tar.gz`` (extracted); a hub id in the local Hugging Face cache (offline). Raises
    ``ModelLoadError`` listing every place it looked.
    """
    model_id = options.model_id
    base = options.base_dir
    if model_id is None or (model_id.rstrip("/") == _SAGEMAKER_MODEL_DIR
                            and not Path(_SAGEMAKER_MODEL_DIR).exists()):
        if (base / "config.json").is_file():
            return LocatedModel(base)
        raise ModelLoadError(f"no model to serve: option.model_id is {model_id or 'not set'} "
                             f"and {base} holds no config.json; set option.model_id to a "
                             f"model directory, URI or hub id", path=str(base))
    if "://" in model_id and not model_id.startswith("file://"):
        from shoal.serving.artifact import resolve_model

        resolved = resolve_model(model_id)
        return LocatedModel(resolved.path, resolved.temp_dir)
    local = Path(model_id.removeprefix("file://")).expanduser()
    local = local if local.is_absolute() else base / local
    if local.is_dir():
        return LocatedModel(local.resolve())
    if local.is_file():  # a model.tar.gz (SageMaker's model_data): extracted
        from shoal.serving.artifact import resolve_model

        resolved = resolve_model(local)
        return LocatedModel(resolved.path, resolved.temp_dir)
    looked = [f"the directory {local}"]
    if looks_like_hub_id(model_id):
        found, where = from_hub_cache(model_id)
        if found is not None:
            return LocatedModel(found)
        looked.append(where)
    raise ModelLoadError(f"option.model_id={model_id!r} cannot be found: looked at "
                         f"{' and '.join(looked)}; give a model directory, a URI (s3://...) or "
                         f"a hub id already in the local cache", model_id=model_id)

