"""Loading the model ``serving.properties`` describes into an engine: transformers (CPU or
GPUs, a device map over ``tensor_parallel_degree`` GPUs, bitsandbytes when asked) or vLLM.
Runs on the server's load thread, after it listens."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoal.errors import ModelLoadError
from shoal.llm.serving._engine import EngineObserver, TransformersEngine
from shoal.llm.serving._lmi import VLLM_HANDLERS
from shoal.llm.serving._properties import LlmServingOptions, LocatedModel, Quantize, locate_model

if TYPE_CHECKING:
    from shoal.llm.serving._embeddings import EmbeddingEngine
    from shoal.llm.serving._engine_process import EngineProcess
    from shoal.llm.serving._vllm import VllmEngine

__all__ = ["LoadedModel", "load_causal_lm", "load_model"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    engine: TransformersEngine | EngineProcess | VllmEngine | EmbeddingEngine
    tokenizer: Any
    located: LocatedModel
    max_model_len: int
    description: str
    #: an encoder served by /v1/embeddings (it does not generate)
    embedding: bool = False


def load_model(options: LlmServingOptions, observer: EngineObserver) -> LoadedModel:
    """The engine for *options*; ``ModelLoadError`` says what is wrong and where it looked."""
    use_vllm = _use_vllm(options)
    located = locate_model(options)
    process = None
    try:
        if use_vllm:
            return _load_vllm(options, located, observer)
        if options.uses_engine_process:
            from shoal.llm.serving._engine_process import EngineProcess

            # started first: it reads the config and the tokenizer beside this process
            process = EngineProcess(max_queue=options.job_queue_size, observer=observer)
            process.spawn(located.path, trust_remote_code=options.trust_remote_code)
        return _load_transformers(options, located, observer, process)
    except BaseException:
        if process is not None:
            process.stop()
        located.cleanup()
        raise


def _use_vllm(options: LlmServingOptions) -> bool:
    """vLLM's engine when asked for and installed; ``engine=vllm`` requires it, while
    ``option.rolling_batch=vllm`` and the vLLM handlers fall back to the transformers engine
    (said once; refused under ``option.shoal_strict=true``)."""
    import importlib.util

    if not options.wants_vllm:
        return False
    if importlib.util.find_spec("vllm") is not None:
        return True
    if options.requires_vllm:
        raise ModelLoadError("engine=vllm needs the vllm package on a GPU machine, and it is "
                             "not installed; install vllm there, or set engine=Python for "
                             "the built-in transformers engine", key="engine")
    key = (f"option.entryPoint={options.handler}" if options.handler in VLLM_HANDLERS
           else "option.rolling_batch=vllm")
    _differs(options, f"{key}: the vllm package is not installed here, so shoal's "
                      f"transformers engine serves the model (continuous batching)",
             key=key.partition("=")[0])
    return False


def _differs(options: LlmServingOptions, message: str, *, key: str) -> None:
    """The model runs otherwise than the file says: said once, or, under
    ``option.shoal_strict=true``, the load fails."""
    if options.strict:
        raise ModelLoadError(f"{message}; option.shoal_strict=true refuses this", key=key)
    log.warning("%s", message)


def _load_vllm(options: LlmServingOptions, located: LocatedModel,
               observer: EngineObserver) -> LoadedModel:
    from shoal.llm.serving._vllm import load_vllm

    try:
        engine, tokenizer, max_len, description = load_vllm(options, str(located.path),
                                                            observer)
    except (OSError, ValueError, RuntimeError, ImportError) as e:
        raise ModelLoadError(f"vLLM cannot load the model from {located.path}: "
                             f"{type(e).__name__}: {e}; option.rolling_batch=auto serves it "
                             f"with the built-in transformers engine",
                             path=str(located.path)) from e
    return LoadedModel(engine, tokenizer, located, max_len, description)


def _load_transformers(options: LlmServingOptions, located: LocatedModel,
                       observer: EngineObserver, process: EngineProcess | None = None
                       ) -> LoadedModel:
    import torch
    from transformers import AutoConfig, AutoTokenizer

    path = located.path
    remote = options.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load the model's config or tokenizer from {path}: {e}",
                             path=str(path)) from e
    limit = getattr(config, "max_position_embeddings", None) or 2048
    max_len = options.max_model_len or limit
    if max_len > limit:
        key = "option.max_model_len / option.n_positions"
        raise ModelLoadError(f"{key}={max_len} is more than the model's "
                             f"max_position_embeddings ({limit}); set at most {limit}", key=key,
                             value=str(max_len))
    from shoal.llm.serving._embeddings import is_embedding_model, load_embedding

    placement = _placement(options, torch)
    dtype = _dtype(options, gpu="device_map" in placement)
    if is_embedding_model(path, config):
        embedder = load_embedding(path, tokenizer, dtype=dtype, max_batch=options.batch_size,
                                  trust_remote_code=remote, placement=placement)
        description = (f"{type(embedder.model).__name__} from {path} (embeddings, "
                       f"{embedder.pooling.value} pooling), max_model_len {max_len}")
        if process is not None:  # an encoder is served here, without an engine process
            process.stop()
        return LoadedModel(embedder, tokenizer, located, max_len, description, embedding=True)
    spec = {"path": str(path), "trust_remote_code": remote, "dtype": dtype,
            "placement": placement, "quantize": options.quantize,
            "max_batch": options.batch_size, "max_model_len": max_len}
    if process is not None:
        process.load(spec)
        return LoadedModel(process, tokenizer, located, max_len,
                           f"{process.description}, in an engine process of its own")
    model, _, description = load_causal_lm(spec, tokenizer)
    engine = TransformersEngine(model, tokenizer, max_batch=options.batch_size,
                                max_queue=options.job_queue_size, max_model_len=max_len,
                                observer=observer)
    return LoadedModel(engine, tokenizer, located, max_len, description)


def load_causal_lm(spec: dict[str, Any], tokenizer: Any = None) -> tuple[Any, Any, str]:
    """The model (and, unless given, the tokenizer) *spec* describes, with its description:
    what ``_load_transformers`` decided (path, dtype, placement, quantization, limits). The
    engine process loads with it too."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, remote, quantize = spec["path"], spec["trust_remote_code"], spec["quantize"]
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote)
    kwargs: dict[str, Any] = {"trust_remote_code": remote, "dtype": spec["dtype"]}
    kwargs.update(spec["placement"])
    if quantize is not None:
        kwargs["quantization_config"] = _quantization(quantize)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    except (OSError, ValueError, ImportError, RuntimeError, NotImplementedError) as e:
        if quantize is not None:  # bitsandbytes refuses this machine or this model
            value = quantize.value
            raise ModelLoadError(f"option.quantize={value}: bitsandbytes cannot load the model "
                                 f"from {path} here: {type(e).__name__}: {e}; remove "
                                 f"option.quantize (or try the other bit width)",
                                 key="option.quantize", value=value, path=str(path)) from e
        if isinstance(e, RuntimeError | NotImplementedError):
            raise
        raise ModelLoadError(f"cannot load the model from {path}: {type(e).__name__}: {e}",
                             path=str(path)) from e
    device = next(model.parameters()).device
    batch = int(spec["max_batch"])
    description = (f"{type(model).__name__} from {path} on {device} "
                   f"({next(model.parameters()).dtype}{_quantized(model, quantize)}), "
                   f"transformers engine, "
                   f"{'continuous batching of up to ' + str(batch) if batch > 1 else 'one request at a time'}, "
                   f"max_model_len {spec['max_model_len']}")
    return model, tokenizer, description


def _quantized(model: Any, quantize: Quantize | None) -> str:
    """``, bitsandbytes4: N layers`` (the layers bitsandbytes replaced), or nothing."""
    if quantize is None:
        return ""
    layers = sum(type(m).__module__.startswith("bitsandbytes") for m in model.modules())
    return f", {quantize.value}: {layers} layers"


def _placement(options: LlmServingOptions, torch: Any) -> dict[str, Any]:
    """Where the weights go: the CPU, one GPU, or a device map over
    ``option.tensor_parallel_degree`` GPUs (``max``: all). A degree above the GPUs present
    runs on what is there, said once (refused under ``option.shoal_strict=true``)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    degree = options.tensor_parallel_degree
    key = "option.tensor_parallel_degree"
    if degree is not None and degree > max(gpus, 1):
        where = f"{gpus} GPU(s)" if gpus else "no GPU, so it runs on the CPU"
        neuron = (" (for Transformers NeuronX the degree counts NeuronCores)"
                  if options.handler and "neuronx" in options.handler else "")
        _differs(options, f"{key}={degree}{neuron}: this machine has {where}; the model is "
                          f"spread over what is there", key=key)
    if gpus == 0:
        return {}
    degree = gpus if degree is None else min(degree, gpus)
    if degree == 1:
        return {"device_map": {"": 0}}
    # the transformers engine splits layers over the GPUs (a device map), not tensors
    return {"device_map": "auto",
            "max_memory": {i: torch.cuda.get_device_properties(i).total_memory
                           for i in range(degree)}}


def _dtype(options: LlmServingOptions, *, gpu: bool) -> str:
    """The torch dtype the weights load in: ``option.dtype``, except fp16 on a CPU, which
    runs in float32 (CPUs lack fast half-precision kernels; bf16 runs as asked), said once
    (refused under ``option.shoal_strict=true``)."""
    if options.dtype == "float16" and not gpu:
        _differs(options, "option.dtype=fp16: this machine has no GPU; the model runs in "
                          "float32 on the CPU (set option.dtype=fp32 or bf16 to say so)",
                 key="option.dtype")
        return "float32"
    return options.dtype


def _quantization(quantize: Quantize) -> Any:
    import importlib.util

    from transformers import BitsAndBytesConfig

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelLoadError(f"option.quantize={quantize.value} needs bitsandbytes, which is not "
                             f"installed ('pip install bitsandbytes'), or remove option.quantize",
                             key="option.quantize", value=quantize.value)
    if quantize is Quantize.BITSANDBYTES4:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    return BitsAndBytesConfig(load_in_8bit=True)
