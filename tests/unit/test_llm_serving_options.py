"""The LLM server's knobs: serving.properties with DJL's environment overrides, generation
parameters, and the stream's text holding (no model, no sockets)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shoal.errors import ConfigError, ModelLoadError
from shoal.llm.serving._engine import _find_stop, _safe_end
from shoal.llm.serving._params import ParamError, from_lmi, from_openai, openai_request
from shoal.llm.serving._properties import (
    Engine,
    Quantize,
    RollingBatch,
    load_serving_options,
    locate_model,
)
from shoal.serving.http import RequestError


def _props(tmp_path: Path, text: str) -> Path:
    (tmp_path / "serving.properties").write_text(text)
    return tmp_path


def test_properties_are_parsed_and_the_environment_overrides_them(tmp_path, caplog):
    d = _props(tmp_path, "engine=Python\noption.model_id=./m\noption.dtype=bf16\n"
                         "option.tensor_parallel_degree=max\noption.rolling_batch=disable\n"
                         "option.n_positions=256\noption.quantize=bitsandbytes\n"
                         "option.entryPoint=model.py\nminWorkers=1\n# comment\n")
    with caplog.at_level(logging.WARNING):
        o = load_serving_options(d, {"OPTION_DTYPE": "fp16", "SERVING_JOB_QUEUE_SIZE": "7",
                                     "OPTION_TRUST_REMOTE_CODE": "true", "OTHER": "x"})
    assert (o.engine, o.model_id, o.dtype, o.tensor_parallel_degree) == (
        Engine.PYTHON, "./m", "float16", None)
    assert o.rolling_batch is RollingBatch.DISABLE and o.batch_size == 1
    assert (o.max_model_len, o.quantize, o.entry_point) == (256, Quantize.BITSANDBYTES8,
                                                            "model.py")
    assert o.job_queue_size == 7 and o.trust_remote_code is True
    assert o.sources["dtype"] == "$OPTION_DTYPE" and o.unknown == ()
    assert [k.key for k in o.kept] == ["minWorkers"]  # DJL's: accepted, no effect here
    assert [r.getMessage() for r in caplog.records if "minWorkers" in r.getMessage()]
    assert load_serving_options(d, {"HF_MODEL_ID": "org/name"}).model_id == "org/name"


@pytest.mark.parametrize(("line", "words"), [
    ("option.dtype=fp99", ["option.dtype='fp99'", "fp32, fp16, bf16"]),
    ("option.max_rolling_batch_size=0", ["option.max_rolling_batch_size='0'", ">= 1"]),
    ("option.rolling_batch=turbo", ["option.rolling_batch='turbo'", "auto, disable, vllm, "
                                                                    "lmi-dist"]),
    ("option.tensor_parallel_degree=two", ["option.tensor_parallel_degree='two'", "max"]),
    ("option.trust_remote_code=maybe", ["maybe", "true or false"]),
    ("engine=PyTorch", ["engine='PyTorch'", "Python, MPI, DeepSpeed", "not LLMs"]),
    ("option.max_rolling_batch_size=abc", ["option.max_rolling_batch_size='abc'", "integer"]),
    ("option.batch_size=four", ["option.batch_size='four'", "integer"]),
    ("option.neuron_optimize_level=9", ["option.neuron_optimize_level='9'", "1, 2 or 3"]),
    ("option.shoal_strict=sure", ["option.shoal_strict='sure'", "true or false"]),
    ("option.entryPoint=djl_python.stable-diffusion", ["option.entryPoint=", "Stable Diffusion",
                                                       "djl_python.huggingface"]),
    ("option.entryPoint=djl_python.nothing", ["djl_python.nothing", "built-in LLM handlers"]),
    ("option.model_loading_timeout=-3", ["option.model_loading_timeout='-3'"]),
])
def test_a_bad_value_names_its_key_and_value(tmp_path, line, words):
    d = _props(tmp_path, line + "\n")
    with pytest.raises(ModelLoadError) as info:
        load_serving_options(d, {})
    for w in words:
        assert w in str(info.value)
    assert "serving.properties" in str(info.value)


def test_a_model_id_that_cannot_be_found_names_where_it_looked(tmp_path):
    o = load_serving_options(_props(tmp_path, "option.model_id=nobody/nothing\n"), {})
    with pytest.raises(ModelLoadError) as info:
        locate_model(o)
    message = str(info.value)
    assert f"{tmp_path}/nobody/nothing" in message and "Hugging Face cache" in message
    bare = load_serving_options(_props(tmp_path, "engine=Python\n"), {})
    with pytest.raises(ModelLoadError, match="holds no config.json"):
        locate_model(bare)
    (tmp_path / "config.json").write_text("{}")
    sagemaker = load_serving_options(_props(tmp_path, "option.model_id=/opt/ml/model\n"), {})
    assert locate_model(sagemaker).path == tmp_path.resolve()


def test_lmi_parameters():
    p = from_lmi({"max_new_tokens": 5, "do_sample": "True", "top_k": 0, "stop": "x",
                  "stop_sequences": ["y"], "seed": 3, "watermark": False, "details": None})
    assert (p.max_new_tokens, p.do_sample, p.stop, p.seed) == (5, True, ("x", "y"), 3)
    assert from_lmi({"temperature": 0.7}).do_sample is True
    assert from_lmi({"temperature": 0, "do_sample": True}).do_sample is False
    assert from_lmi(None).plain_greedy
    for bad, words in (({"max_new_tokens": 0}, ">= 1"), ({"top_p": 0}, "top_p"),
                       ({"stop": [""]}, "non-empty"), ({"typical_p": 0.5}, "typical_p"),
                       ({"temperature": "hot"}, "number"), ({"foo": 1}, "['foo']")):
        with pytest.raises(RequestError) as info:
            from_lmi(bad)
        assert info.value.status == 422 and words in info.value.detail


def test_openai_fields():
    p = from_openai({"model": "m", "max_tokens": 3, "temperature": 0, "stop": ["\n"]},
                    default_max_tokens=16)
    assert (p.max_new_tokens, p.do_sample, p.stop) == (3, False, ("\n",))
    assert from_openai({}, default_max_tokens=16).do_sample is True  # OpenAI's temperature 1
    request = openai_request({"n": 3, "logprobs": 2, "seed": 5, "presence_penalty": 0.5,
                              "logit_bias": {"7": -100}}, chat=False, default_max_tokens=16)
    assert (request.n, request.logprobs, request.params.top_logprobs) == (3, 2, 2)
    assert request.params.logit_bias == ((7, -100.0),) and not request.params.plain_greedy
    chat = openai_request({"logprobs": True, "top_logprobs": 4, "temperature": 0}, chat=True,
                          default_max_tokens=16)
    assert (chat.logprobs, chat.params.top_logprobs, chat.params.plain_greedy) == (4, 4, True)
    for body, chat_route, param in (({"wat": 1}, False, "wat"), ({"n": 0}, False, "n"),
                                    ({"top_logprobs": 2}, True, "top_logprobs"),
                                    ({"logprobs": 21}, False, "logprobs"),
                                    ({"logit_bias": {"x": 1}}, False, "logit_bias"),
                                    ({"logit_bias": {"1": 101}}, False, "logit_bias"),
                                    ({"presence_penalty": 3}, False, "presence_penalty"),
                                    ({"suffix": "x"}, False, "suffix"),
                                    ({"echo": True, "logprobs": 1}, False, "echo")):
        with pytest.raises(ParamError) as info:
            openai_request(body, chat=chat_route, default_max_tokens=16)
        assert info.value.param == param, body


def test_streamed_text_holds_back_partial_characters_and_stop_prefixes():
    assert _safe_end("hello wor", ("world!",)) == len("hello ")
    assert _safe_end("caf\ufffd", ()) == 3
    assert _safe_end("abc", ("x",)) == 3
    assert _find_stop("one. two. three", ("wo.", ". t"), 0) == 3
    assert _find_stop("abc", ("z",), 0) is None


def test_served_model_names_come_from_the_flag_or_the_model():
    from shoal.llm.serving._openai import default_model_name
    from shoal.serving import ServerOptions
    from shoal.serving.__main__ import _parser

    args = _parser().parse_args(["--model", "m", "--served-model-name", "a", "b/c"])
    assert args.served_model_name == ["a", "b/c"]
    assert ServerOptions(served_model_name=("a",)).served_model_name == ("a",)
    with pytest.raises(ConfigError, match="served_model_name"):
        ServerOptions(served_model_name=("",))
    assert default_model_name("meta-llama/Llama-2-7b-hf", "model") == "meta-llama/Llama-2-7b-hf"
    assert default_model_name("s3://bucket/llama-7b/", "model") == "llama-7b"
    assert default_model_name("/opt/ml/model", "x") == "model"
    assert default_model_name(None, "tiny") == "tiny"


def test_shoal_serve_hands_every_served_name_to_the_server(monkeypatch):
    """``shoal serve`` (generated from the server's flags) repeats --served-model-name per
    name and hands them to ``python -m shoal.serving`` as one flag with several values."""
    import os

    import typer
    from typer.testing import CliRunner

    from shoal.cli._endpoints import register_serve
    from shoal.serving.__main__ import _parser

    app = typer.Typer()  # shoal serve alone: the full CLI's callback configures logging
    register_serve(app)
    app.command("other")(lambda: None)  # two commands: 'serve' stays a subcommand

    seen: dict[str, list[str]] = {}

    def execve(executable: str, argv: list[str], env: dict[str, str]) -> None:
        seen["argv"] = argv
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    result = CliRunner().invoke(app, ["serve", "model/", "--served-model-name", "tiny",
                                      "--served-model-name", "org/tiny"])
    assert result.exit_code == 0, result.output
    argv = seen["argv"]
    at = argv.index("--served-model-name")
    assert argv[at:at + 3] == ["--served-model-name", "tiny", "org/tiny"]
    args = _parser().parse_args(argv[argv.index("--model"):])
    assert args.served_model_name == ["tiny", "org/tiny"]
