"""The ``djl_python`` stand-in (``Input``, ``Output``, ``PairList`` as DJL Serving's Python
engine defines them), its registration under that name, and how ``option.entryPoint`` files
are told apart and their ``Output`` turned into a response (no sockets, no user code run)."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from shoal.errors import ModelLoadError
from shoal.llm.serving import _djl_python as djl
from shoal.llm.serving._custom import (
    EntryPointKind,
    _response,
    check_entry_point,
    init_properties,
)
from shoal.llm.serving._properties import load_serving_options


def _request(body: bytes, **headers: str) -> djl.Input:
    inputs = djl.Input()
    inputs.properties.update(headers)
    inputs.content.add(key="data", value=bytearray(body))
    return inputs


def test_input_reads_the_body_as_djl_does():
    inputs = _request(b'{"inputs": "hi", "n": 2}', **{"Content-Type": "application/json"})
    assert not inputs.is_empty()
    assert inputs.get_as_json() == {"inputs": "hi", "n": 2}
    assert inputs.get_as_string() == '{"inputs": "hi", "n": 2}'
    assert bytes(inputs.get_as_bytes()) == b'{"inputs": "hi", "n": 2}'
    assert inputs.get_data() == {"inputs": "hi", "n": 2}  # decoded by its content type
    assert inputs.get_property("content-type") == "application/json"  # any case
    assert inputs.get_property("missing") is None
    assert inputs.contains_key("data") and not inputs.contains_key("other")
    assert inputs.get_batches() == [inputs] and not inputs.is_batch()
    with pytest.raises(KeyError, match="other"):
        inputs.get_as_bytes("other")
    assert _request(b"a,b\n1,2\n").get_as_csv() == [{"a": "1", "b": "2"}]

    init = djl.Input()
    assert init.is_empty() and init.get_as_bytes() is None and init.get_data() is None


def test_a_batched_input_splits_into_its_requests():
    batch = djl.Input()
    batch.properties.update({"batch_size": "2", "batch_0.content-type": "text/plain",
                             "batch_1.content-type": "application/json", "model_dir": "/m"})
    batch.content.add("batch_0.data", b"one")
    batch.content.add("batch_1.data", b'"two"')
    first, second = batch.get_batches()
    assert first.get_data() == "one" and second.get_data() == "two"
    assert first.get_property("model_dir") == "/m"


def test_output_chains_and_writes_json_text_bytes_and_errors():
    out = djl.Output().set_code(201).set_message("Created").add_property("X-A", "1")
    out.add({"a": [1, 2]}).add("text", key="t").add(b"\x00\x01", key="b")
    assert (out.code, out.message, out.properties) == (201, "Created", {"X-A": "1"})
    assert json.loads(out.content.value_at(0)) == {"a": [1, 2]}
    assert out.content.get("t") == b"text" and out.content.get("b") == bytearray(b"\x00\x01")
    assert json.loads(str(out))["code"] == 201

    failed = djl.Output().error("bad prompt")
    assert failed.code == 424 and failed.properties["content-type"] == "application/json"
    assert json.loads(failed.content.value_at(0)) == {"code": 424, "message":
                                                      "prediction failure",
                                                      "error": "bad prompt"}


def test_the_stand_in_is_importable_as_djl_python_only_while_registered():
    assert "djl_python" not in sys.modules
    assert djl.register()
    try:
        module = importlib.import_module("djl_python")
        from djl_python.outputs import Output  # type: ignore[import-not-found]

        assert module.Input is djl.Input and Output is djl.Output
        assert djl.djl_module() is djl
        assert not djl.register()  # already there: nothing to do
    finally:
        djl.unregister()
    assert "djl_python" not in sys.modules and "djl_python.outputs" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("djl_python")


def _entry(tmp_path: Path, source: str | None, name: str = "model.py"):
    (tmp_path / "serving.properties").write_text(
        f"engine=Python\noption.entryPoint={name}\noption.my_key=7\noption.dtype=fp16\n")
    if source is not None:
        (tmp_path / name).write_text(source)
    return load_serving_options(tmp_path, {})


@pytest.mark.parametrize(("source", "kind"), [
    ("def handle(inputs):\n    return None\n", EntryPointKind.DJL),
    ("from service import handle\n", EntryPointKind.DJL),
    ("handle = object()\n", EntryPointKind.DJL),
    ("from service import *\n", EntryPointKind.DJL),
    ("def model_fn(d):\n    return 1\n\ndef predict_fn(x, m):\n    return x\n",
     EntryPointKind.TOOLKIT),
])
def test_the_entry_points_contract_is_read_from_its_source(tmp_path, source, kind):
    script, found = check_entry_point(_entry(tmp_path, source))
    assert (script, found) == (tmp_path.resolve() / "model.py", kind)


@pytest.mark.parametrize(("source", "needle"), [
    (None, "does not exist"),
    ("def handle(:\n", "is not valid Python"),
    ("def predict(x):\n    return x\n", "defines no handle(inputs) function"),
])
def test_a_bad_entry_point_is_refused_before_anything_runs(tmp_path, source, needle):
    with pytest.raises(ModelLoadError, match=re.escape(needle)) as info:
        check_entry_point(_entry(tmp_path, source))
    assert "option.entryPoint='model.py'" in str(info.value)
    assert info.value.details["key"] == "option.entryPoint"


def test_the_initialisation_call_gets_option_keys_without_their_prefix(tmp_path):
    llm = _entry(tmp_path, "def handle(inputs):\n    return None\n")
    assert init_properties(llm) == {"entryPoint": "model.py", "my_key": "7", "dtype": "fp16",
                                    "model_dir": str(tmp_path.resolve()), "device_id": "-1"}
    assert llm.unknown == ("option.my_key",)


def test_an_output_becomes_status_headers_and_body():
    status, headers, body = _response(djl.Output().add_as_json({"a": 1})
                                      .add_property("X-Trace", "t"))
    assert status == 200 and json.loads(body) == {"a": 1}
    assert dict(headers) == {b"x-trace": b"t", b"content-type": b"application/json",
                             b"content-length": str(len(body)).encode()}
    # the value under "data" wins; text without a type is text/plain; a bad code is 500
    out = djl.Output().set_code(999).add("first", key="other").add("second", key="data")
    status, headers, body = _response(out)
    assert (status, body) == (500, b"second")
    assert dict(headers)[b"content-type"] == b"text/plain; charset=utf-8"
    assert dict(_response(djl.Output().add(b"\xff\x00"))[1])[b"content-type"] == \
        b"application/octet-stream"
