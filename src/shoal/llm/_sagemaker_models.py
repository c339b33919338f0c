"""``HuggingFaceModel`` and ``DJLModel``: SageMaker's LLM deployment idioms on shoal's servers.

Both end as a ``Model`` whose model data is a directory holding ``serving.properties``, which
``deploy()`` serves with shoal's LLM server (transformers engine, or vLLM when asked): a model
directory, a URL or a hub id goes into ``option.model_id``. A ``HuggingFaceModel`` with
inference code (``entry_point`` or ``code/inference.py``) is served by the model server
instead, as SageMaker's inference toolkit would. Hub ids are read from the local Hugging Face
cache only (no network here): one that is not there fails when the model is made, saying where
it looked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal.endpoints import Model, Predictor
from shoal.errors import InvalidArgumentError
from shoal.llm._serving import read_serving_properties, write_serving_properties

__all__ = ["DJLModel", "DJLPredictor", "HuggingFaceModel", "HuggingFacePredictor"]

#: HF_TASK values the LLM server answers (generation); others need inference code.
_GENERATION_TASKS = frozenset({"text-generation", "text2text-generation", "conversational"})
#: TGI container variables -> serving.properties keys of the same meaning.
_TGI_KEYS = {"SM_NUM_GPUS": "option.tensor_parallel_degree",
             "MAX_TOTAL_TOKENS": "option.max_model_len",
             "HF_MODEL_TRUST_REMOTE_CODE": "option.trust_remote_code"}


class HuggingFacePredictor(Predictor):
    """A ``Predictor`` speaking JSON (``{"inputs": ..., "parameters": {...}}``)."""


class DJLPredictor(Predictor):
    """A ``Predictor`` speaking JSON to a DJL/LMI endpoint."""


def _session_home(session: object) -> Path:
    from shoal.session import Session, current

    return (session if isinstance(session, Session) else current()).home


def _stage_properties(properties: Mapping[str, str], session: object) -> str:
    """A directory holding only ``serving.properties`` with *properties*; named after its
    content, so making the same model twice reuses it."""
    body = "".join(f"{k}={v}\n" for k, v in sorted(properties.items()))
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    target = _session_home(session) / "llm-models" / digest
    target.mkdir(parents=True, exist_ok=True)
    if not (target / "serving.properties").is_file():
        tmp = target / ".serving.properties.tmp"
        write_serving_properties(tmp, dict(properties))
        os.replace(tmp, target / "serving.properties")
    return str(target)


def _model_id(value: str) -> str:
    """A local directory or ``model.tar.gz`` as an absolute path; URLs and hub ids as given (a hub id must be in
    the local cache)."""
    if "://" in value:
        return value
    local = Path(value).expanduser()
    if local.is_dir() or local.is_file():  # a model directory or its model.tar.gz
        return str(local.resolve())
    from shoal.llm._hub import from_hub_cache, looks_like_hub_id

    if looks_like_hub_id(value):
        found, where = from_hub_cache(value)
        if found is not None:
            return value
        raise InvalidArgumentError(
            f"model id {value!r} is neither a local directory nor in {where}; there is no "
            "network here to download it: fetch it where there is (huggingface-cli download "
            f"{value}) into this cache, or give the model's directory", model_id=value)
    raise InvalidArgumentError(f"model id {value!r} is not a directory or model.tar.gz "
                               f"(looked for "
                               f"{local.resolve()}), a URL or a hub id", model_id=value)


def _has_code(model_data: Any, entry_point: str | None, source_dir: str | None) -> bool:
    if entry_point or source_dir:
        return True
    if isinstance(model_data, str | os.PathLike) and "://" not in os.fspath(model_data):
        return (Path(model_data) / "code" / "inference.py").is_file()
    return False


def _is_lmi_image(image_uri: str | None) -> bool:
    """``get_huggingface_llm_image_uri("lmi")`` (shoal's) or an AWS DJL/LMI image URI."""
    return image_uri is not None and any(name in image_uri for name in ("djl-lmi",
                                                                        "djl-inference"))


def _answer_as_tgi(env: dict[str, str]) -> None:
    """The LLM server answers ``/invocations`` as TGI's container does: a one-element list;
    ``return_full_text`` defaults to true for text generation (TGI's default for a model whose
    pipeline tag is ``text-generation`` or unknown), false for another ``HF_TASK``. Variables
    the caller set win."""
    env.setdefault("OPTION_TGI_COMPAT", "true")
    task = env.get("HF_TASK", "text-generation")
    env.setdefault("OPTION_RETURN_FULL_TEXT", "true" if task == "text-generation" else "false")


class HuggingFaceModel(Model):
    """``sagemaker.huggingface.HuggingFaceModel`` (SageMaker's arguments, in its order).

    - ``env={"HF_MODEL_ID": "org/name"}`` (TGI's idiom) or *model_data* a model directory /
      URL: served by the LLM server; ``SM_NUM_GPUS``, ``MAX_TOTAL_TOKENS`` and
      ``HF_MODEL_TRUST_REMOTE_CODE`` mean what they mean in TGI's container.
    - *model_data* with ``code/inference.py``, or *entry_point*: the model server runs your
      handlers (``model_fn``/``predict_fn``...).

    Served by the LLM server, ``predict({"inputs": ..., "parameters": {...}})`` answers as
    TGI's container does, ``[{"generated_text": ...}]`` with the prompt prepended unless
    ``parameters.return_full_text`` is false (``env`` ``OPTION_TGI_COMPAT`` /
    ``OPTION_RETURN_FULL_TEXT``, set here, say so); with an LMI *image_uri*
    (``get_huggingface_llm_image_uri("lmi")``) it answers as LMI, ``{"generated_text": ...}``.

    *transformers_version*, *pytorch_version* and *py_version* are recorded.
    """

    def __init__(self, role: str | None = None, model_data: Any = None,
                 entry_point: str | None = None, transformers_version: str | None = None,
                 tensorflow_version: str | None = None, pytorch_version: str | None = None,
                 py_version: str | None = None, image_uri: str | None = None,
                 predictor_cls: Any = HuggingFacePredictor,
                 model_server_workers: int | None = None, **kwargs: Any) -> None:
        env = {str(k): str(v) for k, v in (kwargs.pop("env", None) or {}).items()}
        session = kwargs.get("sagemaker_session")
        task = env.get("HF_TASK")
        if not _has_code(model_data, entry_point, kwargs.get("source_dir")):
            if task is not None and task not in _GENERATION_TASKS:
                raise InvalidArgumentError(
                    f"HF_TASK={task!r}: shoal's LLM server answers text generation "
                    f"({', '.join(sorted(_GENERATION_TASKS))}); for {task} give inference code "
                    "(entry_point='inference.py' with model_fn/predict_fn, or "
                    "code/inference.py in model_data)", argument="env")
            model_data = self._serving_dir(model_data, env, session)
            if not _is_lmi_image(image_uri):
                _answer_as_tgi(env)
        if model_server_workers is not None:
            env.setdefault("SHOAL_MODEL_SERVER_WORKERS", str(model_server_workers))
        super().__init__(model_data=model_data, image_uri=image_uri, role=role,
                         entry_point=entry_point, env=env, predictor_cls=predictor_cls,
                         **kwargs)
        self.transformers_version = transformers_version
        self.tensorflow_version = tensorflow_version
        self.pytorch_version = pytorch_version
        self.py_version = py_version
        self.model_server_workers = model_server_workers

    @staticmethod
    def _serving_dir(model_data: Any, env: dict[str, str], session: object) -> str:
        hub_id = env.pop("HF_MODEL_ID", None)
        if model_data is not None and hub_id is not None:
            raise InvalidArgumentError("give model_data or env HF_MODEL_ID, not both",
                                       argument="model_data")
        if model_data is None and hub_id is None:
            raise InvalidArgumentError("HuggingFaceModel needs model_data (a model directory, "
                                       "model.tar.gz or URL) or env={'HF_MODEL_ID': 'org/name'}",
                                       argument="model_data")
        source = os.fspath(model_data) if model_data is not None else str(hub_id)
        if "://" not in source and (Path(source) / "serving.properties").is_file():
            return source
        properties = {"engine": "Python", "option.model_id": _model_id(source)}
        for var, key in _TGI_KEYS.items():
            if var in env:
                properties[key] = env[var].lower() if var.endswith("CODE") else env[var]
        return _stage_properties(properties, session)


class DJLModel(Model):
    """``sagemaker.djl_inference.DJLModel`` (SageMaker's arguments, in its order): a
    ``serving.properties`` model (``model_data``) or a model id (directory, URL or cached hub
    id) served by shoal's LLM server; the arguments become ``serving.properties`` keys (or
    DJL's ``OPTION_*``/``SERVING_*`` variables over a given ``serving.properties``)."""

    def __init__(self, model_id: str | None = None, engine: str | None = None,
                 djl_version: str = "latest", djl_framework: str | None = None,
                 task: str | None = None, dtype: str | None = None,
                 tensor_parallel_degree: int | None = None, min_workers: int | None = None,
                 max_workers: int | None = None, job_queue_size: int | None = None,
                 parallel_loading: bool = False, model_loading_timeout: int | None = None,
                 prediction_timeout: int | None = None, predictor_cls: Any = DJLPredictor,
                 huggingface_hub_token: str | None = None, **kwargs: Any) -> None:
        env = {str(k): str(v) for k, v in (kwargs.pop("env", None) or {}).items()}
        model_data = kwargs.pop("model_data", None)
        if model_id is not None and model_data is not None:
            raise InvalidArgumentError("both model_id and model_data are given; give one "
                                       "(SageMaker's rule)", argument="model_id")
        model_id = model_id or env.pop("HF_MODEL_ID", None)
        given = {"engine": engine, "option.dtype": dtype,
                 "option.tensor_parallel_degree": tensor_parallel_degree,
                 "job_queue_size": job_queue_size,
                 "option.model_loading_timeout": model_loading_timeout}
        options = {k: str(v) for k, v in given.items() if v is not None}
        if model_data is None:
            if model_id is None:
                raise InvalidArgumentError("DJLModel needs model_id (a model directory, URL or "
                                           "hub id) or model_data (a directory with "
                                           "serving.properties)", argument="model_id")
            if "://" not in model_id and (Path(model_id) / "serving.properties").is_file():
                model_data = model_id
            else:
                props = {"engine": "Python", **options, "option.model_id": _model_id(model_id)}
                model_data = _stage_properties(props, kwargs.get("sagemaker_session"))
        elif options:  # over the given serving.properties, as DJL's variables
            for key, value in options.items():
                var = ("OPTION_" + key.removeprefix("option.") if key.startswith("option.")
                       else "SERVING_" + key).upper()
                env.setdefault(var, value)
        if huggingface_hub_token:
            env.setdefault("HF_TOKEN", huggingface_hub_token)
        super().__init__(model_data=model_data, env=env, predictor_cls=predictor_cls,
                         **kwargs)
        self.model_id, self.engine, self.task = model_id, engine, task
        self.djl_version, self.djl_framework = djl_version, djl_framework
        self.dtype, self.tensor_parallel_degree = dtype, tensor_parallel_degree
        self.min_workers, self.max_workers = min_workers, max_workers
        self.job_queue_size, self.parallel_loading = job_queue_size, parallel_loading
        self.model_loading_timeout = model_loading_timeout
        self.prediction_timeout = prediction_timeout

    def serving_properties(self) -> dict[str, str]:
        """The ``serving.properties`` this model is served with (before the environment's
        overrides)."""
        return read_serving_properties(Path(self.model_data))
