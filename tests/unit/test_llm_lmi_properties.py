"""serving.properties as DJL reads it (issue #19 items 1-2): java.util.Properties syntax
(the examples of the ``Properties.load`` Javadoc), DJL's built-in ``djl_python.*`` handlers,
every ``engine`` and ``option.rolling_batch`` value LMI documents, the keys kept with no
effect, unknown keys said once by name, and ``option.shoal_strict``. No model, no sockets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shoal.errors import ModelLoadError
from shoal.llm import read_serving_properties, write_serving_properties
from shoal.llm.serving._lmi import BUILTIN_HANDLERS
from shoal.llm.serving._properties import Engine, RollingBatch, load_serving_options

#: the Llama 2 article's serving.properties (Transformers NeuronX on inf2), model_id aside
ARTICLE = """engine=Python
option.entryPoint=djl_python.transformers_neuronx
option.model_id={model_id}
option.batch_size=4
option.neuron_optimize_level=2
option.tensor_parallel_degree=8
option.n_positions=512
option.rolling_batch=auto
option.dtype=fp16
option.model_loading_timeout=1500
"""


def _props(tmp_path: Path, text: str) -> Path:
    (tmp_path / "serving.properties").write_text(text, encoding="utf-8")
    return tmp_path


def test_the_javadoc_examples_read_as_java_reads_them(tmp_path):
    # java.util.Properties.load(Reader): each of the first three lines is key "Truth",
    # value "Beauty"; "fruits" continues over three lines; "cheeses" has an empty value
    d = _props(tmp_path, "Truth = Beauty\n"
                         " Truth2:Beauty\n"
                         "Truth3                    :Beauty\n"
                         "fruits                           apple, banana, pear, \\\n"
                         "                                 cantaloupe, watermelon, \\\n"
                         "                                 kiwi, mango\n"
                         "cheeses\n"
                         "! a bang comment\n"
                         "# a comment line ending in a backslash does not continue \\\n"
                         "   \t leading=whitespace is skipped\n"
                         "key\\:with\\=separators\\ inside = a\\tb\\nc\\u00e9\\q\n"
                         "dup=1\n"
                         "dup=2\n")
    assert read_serving_properties(d) == {
        "Truth": "Beauty", "Truth2": "Beauty", "Truth3": "Beauty",
        "fruits": "apple, banana, pear, cantaloupe, watermelon, kiwi, mango",
        "cheeses": "", "leading": "whitespace is skipped",
        "key:with=separators inside": "a\tb\nc\u00e9q",  # an unknown escape (\q) is the char
        "dup": "2"}


def test_a_colon_or_space_separator_is_not_dropped(tmp_path):
    o = load_serving_options(_props(tmp_path, "option.max_rolling_batch_size: 4\n"
                                              "option.dtype fp32\n"
                                              "option.max_model_len \\\n  256\n"), {})
    assert (o.batch_size, o.dtype, o.max_model_len) == (4, "float32", 256)


def test_a_malformed_escape_fails_naming_the_file_and_line(tmp_path):
    d = _props(tmp_path, "engine=Python\noption.model_id=\\u12g4\n")
    with pytest.raises(ModelLoadError) as info:
        load_serving_options(d, {})
    assert f"{d / 'serving.properties'}:2:" in str(info.value) and "\\uXXXX" in str(info.value)
    (d / "serving.properties").write_bytes(b"option.model_id=caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(ModelLoadError, match="serving.properties:1: not UTF-8"):
        load_serving_options(d, {})


def test_written_properties_read_back_unchanged(tmp_path):
    props = {"engine": "Python", "option.model_id": " C:\\models\\llama", "option.note":
             "a=b: c # d\nline\ttab", "odd key:=": "v", "option.flag": True}
    write_serving_properties(tmp_path, props)
    assert read_serving_properties(tmp_path) == {**props, "option.flag": "true"}


def test_the_articles_file_loads_with_its_handler_mapped_and_neuron_keys_kept(tmp_path, caplog):
    d = _props(tmp_path, ARTICLE.format(model_id="s3://my-bucket/llama-2-7b/"))
    with caplog.at_level(logging.INFO, logger="shoal.llm.serving._properties"):
        o = load_serving_options(d, {})
    assert o.handler == "djl_python.transformers_neuronx" and o.entry_point is None
    assert (o.engine, o.rolling_batch, o.batch_size) == (Engine.PYTHON, RollingBatch.AUTO, 4)
    assert (o.tensor_parallel_degree, o.max_model_len, o.dtype) == (8, 512, "float16")
    assert o.model_loading_timeout == 1500 and o.model_id == "s3://my-bucket/llama-2-7b/"
    assert [(k.key, k.value) for k in o.kept] == [("option.neuron_optimize_level", "2")]
    assert o.unknown == () and not o.strict
    engine, neuron = o.notes
    assert "served by shoal's transformers engine, continuous batching of up to 4" in engine
    assert "in DJL: Transformers NeuronX" in engine and "engine=Python" in engine
    assert "option.neuron_optimize_level=2" in neuron and "Neuron" in neuron
    logged = [r.getMessage() for r in caplog.records]
    assert logged == list(o.notes)  # each said once


@pytest.mark.parametrize("handler", sorted(BUILTIN_HANDLERS))
def test_every_built_in_handler_is_served_by_shoals_engine(tmp_path, handler):
    o = load_serving_options(_props(tmp_path, f"option.entryPoint={handler}\n"), {})
    assert o.handler == handler and o.entry_point is None
    assert f"option.entryPoint={handler}" in o.notes[0]
    assert "served by " in o.notes[0] and f"in DJL: {BUILTIN_HANDLERS[handler]}" in o.notes[0]
    if "vllm" in handler:
        assert "vLLM's engine if the vllm package is installed" in o.notes[0]
    else:
        assert "shoal's transformers engine" in o.notes[0] and not o.wants_vllm


@pytest.mark.parametrize("value", [r.value for r in RollingBatch])
def test_every_rolling_batch_value_is_accepted_and_says_its_engine(tmp_path, value):
    o = load_serving_options(_props(tmp_path, f"option.rolling_batch={value.upper()}\n"), {})
    assert o.rolling_batch.value == value
    assert f"option.rolling_batch={value.upper()}" in o.notes[0]
    if value == "disable":
        assert o.batch_size == 1 and "one request at a time" in o.notes[0]
    else:
        assert o.batch_size == 32 and "continuous batching of up to 32" in o.notes[0]


@pytest.mark.parametrize("value", ["Python", "MPI", "DeepSpeed", "FasterTransformer",
                                   "transformers", "vllm"])
def test_every_engine_value_is_accepted_and_says_its_engine(tmp_path, value):
    o = load_serving_options(_props(tmp_path, f"engine={value}\n"), {})
    assert o.engine.value == value.lower() and f"engine={value}" in o.notes[0]
    expected = "served by vLLM's engine," if value == "vllm" else "shoal's transformers engine"
    assert expected in o.notes[0]


def test_batch_size_is_the_limit_unless_max_rolling_batch_size_is_set(tmp_path):
    limit = {text: load_serving_options(_props(tmp_path, text), {}).batch_size for text in (
        "option.batch_size=4\n", "option.batch_size=4\noption.max_rolling_batch_size=16\n",
        "option.rolling_batch=disable\noption.batch_size=4\n",
        "option.rolling_batch=disable\noption.entryPoint=djl_python.lmi_vllm.vllm_async_service"
        "\noption.max_rolling_batch_size=8\n")}
    assert list(limit.values()) == [4, 16, 4, 8]  # the async service batches on its own


def test_an_unknown_option_is_reported_once_by_name(tmp_path, caplog):
    d = _props(tmp_path, "option.frobnicate=1\noption.max_rolling_batch_size=8\n")
    with caplog.at_level(logging.WARNING):
        o = load_serving_options(d, {})
    said = [r.getMessage() for r in caplog.records if "option.frobnicate" in r.getMessage()]
    assert len(said) == 1 and "does not know" in said[0]
    assert o.unknown == ("option.frobnicate",) and said[0] in o.notes


def test_strict_mode_refuses_keys_with_no_effect(tmp_path):
    d = _props(tmp_path, ARTICLE.format(model_id=".") + "option.shoal_strict=true\n")
    with pytest.raises(ModelLoadError) as info:
        load_serving_options(d, {})
    assert "option.neuron_optimize_level" in str(info.value)
    assert str(d / "serving.properties") in str(info.value)
    d = _props(tmp_path, "option.frobnicate=1\n")
    with pytest.raises(ModelLoadError, match="option.frobnicate"):
        load_serving_options(d, {"OPTION_SHOAL_STRICT": "true"})
    assert load_serving_options(_props(tmp_path, "engine=MPI\n"),
                                {"OPTION_SHOAL_STRICT": "true"}).strict
