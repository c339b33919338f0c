"""``option.entryPoint`` (issue #8), served by real ``python -m shoal.serving`` processes: DJL's
``handle(inputs)`` contract (``from djl_python import Input, Output`` without DJL installed;
the initialisation call gets the properties; requests get headers and body; the Output's code,
headers and body are the response; a raise is a 424 for that request only); the inference
toolkit's ``model_fn``/``predict_fn`` file; and a missing file, a file without ``handle``, or
one raising on import or at initialisation failing the load, naming the key and the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

from llm_models import SERVER, SERVER_ENV, running  # noqa: E402

#: A DJL handler that serves the tiny LLM beside it (greedy generate) and echoes what it got.
DJL_MODEL_PY = '''
from djl_python import Input, Output

state = {}


def handle(inputs: Input):
    if inputs.is_empty():  # the initialisation call
        state["init"] = dict(inputs.get_properties())
        if "model_id" in state["init"]:
            from transformers import AutoModelForCausalLM, AutoTokenizer
            where = state["init"]["model_dir"]
            state["tokenizer"] = AutoTokenizer.from_pretrained(where)
            state["model"] = AutoModelForCausalLM.from_pretrained(where).eval()
        return None
    content_type = inputs.get_property("Content-Type")
    if content_type.startswith("text/"):
        return (Output().set_code(201).add_property("X-Handler", "djl")
                .add_property("Content-Type", "text/plain").add(inputs.get_as_string().upper()))
    body = inputs.get_as_json()
    if body.get("raise"):
        raise ValueError(body["raise"])
    if body.get("nothing"):
        return None
    if body.get("echo"):
        return Output().add_as_json({"init": state["init"], "content_type": content_type,
                                     "header": inputs.get_property("x-trace"),
                                     "empty": inputs.is_empty(),
                                     "bytes": len(inputs.get_as_bytes())})
    import torch
    tokenizer = state["tokenizer"]
    ids = torch.tensor([tokenizer(body["inputs"])["input_ids"]])
    with torch.no_grad():
        out = state["model"].generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
            max_new_tokens=body["parameters"]["max_new_tokens"],
            pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    return Output().add_as_json({"generated_text": text})
'''


def _write(directory: Path, properties: str, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "serving.properties").write_text(textwrap.dedent(properties))
    for name, text in files.items():
        (directory / name).write_text(textwrap.dedent(text))
    return directory


def test_a_djl_handle_entry_point_serves_an_llm_and_answers_as_djl_does(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_models import Reference, make_tiny_llm

    model_dir = make_tiny_llm(tmp_path / "model", option_entryPoint="model.py",
                              option_model_id=".", option_my_setting="42")
    (model_dir / "model.py").write_text(DJL_MODEL_PY)
    with running(model_dir, tmp_path) as (url, log):
        prompt = "A reef answers"
        answer = httpx.post(f"{url}/invocations", timeout=60, json={
            "inputs": prompt, "parameters": {"max_new_tokens": 8}})
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"generated_text": Reference(model_dir).text(prompt, 8)}

        echo = httpx.post(f"{url}/invocations", json={"echo": True},
                          headers={"X-Trace": "t-1"}).json()
        init = echo.pop("init")
        assert echo == {"content_type": "application/json", "header": "t-1", "empty": False,
                        "bytes": len(b'{"echo":true}')}
        # DJL's initialisation properties: option.* keys without the prefix, and model_dir
        assert init["my_setting"] == "42" and init["entryPoint"] == "model.py"
        assert init["dtype"] == "fp32" and init["model_dir"] == str(model_dir.resolve())

        text = httpx.post(f"{url}/invocations", content=b"shoal",
                          headers={"Content-Type": "text/plain"})
        assert (text.status_code, text.text) == (201, "SHOAL")
        assert text.headers["x-handler"] == "djl"
        assert text.headers["content-type"] == "text/plain"

        failed = httpx.post(f"{url}/invocations", json={"raise": "no such tool"})
        assert failed.status_code == 424
        assert failed.json() == {"code": 424, "message": "prediction failure",
                                 "error": "no such tool"}
        nothing = httpx.post(f"{url}/invocations", json={"nothing": True})
        assert (nothing.status_code, nothing.content) == (204, b"")
        assert httpx.get(f"{url}/ping").status_code == 200  # still up after the failure
        metrics = httpx.get(f"{url}/metrics").text
        assert 'shoal_invocations_total{status="424"} 1.0' in metrics
    server_log = log.read_text()
    assert "ValueError: no such tool" in server_log  # the traceback is logged
    assert "passing option.my_setting to option.entryPoint's handler" in server_log


def test_an_inference_toolkit_entry_point_still_works(tmp_path):
    model_dir = _write(tmp_path / "model", "engine=Python\noption.entryPoint=model.py\n", {
        "model.py": """
            def model_fn(model_dir):
                return {"scale": 3}

            def predict_fn(data, model):
                return [x * model["scale"] for x in data]
        """})
    with running(model_dir, tmp_path) as (url, _):
        answer = httpx.post(f"{url}/invocations", json=[1, 2])
        assert (answer.status_code, answer.json()) == (200, [3, 6])


BAD_ENTRY_POINTS = {
    "missing": ({}, "nope.py does not exist"),
    "no handle": ({"model.py": "def predict(x):\n    return x\n"},
                  "defines no handle(inputs) function"),
    "raises on import": ({"model.py": "raise RuntimeError('weights are gone')\n\n"
                                      "def handle(inputs):\n    return None\n"},
                         "importing it failed: RuntimeError: weights are gone"),
    "raises at initialisation": (
        {"model.py": """
            from djl_python import Input

            def handle(inputs: Input):
                if inputs.is_empty():
                    raise OSError("cannot read " + inputs.get_properties()["model_dir"])
                return None
        """}, "handle() raised at initialisation"),
}


@pytest.mark.parametrize("case", list(BAD_ENTRY_POINTS))
def test_a_broken_entry_point_fails_the_load_naming_key_and_file(tmp_path, case):
    files, needle = BAD_ENTRY_POINTS[case]
    name = "nope.py" if case == "missing" else "model.py"
    model_dir = _write(tmp_path / "model", f"engine=Python\noption.entryPoint={name}\n", files)
    proc = subprocess.run([*SERVER, "--model", str(model_dir)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, **SERVER_ENV})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert f"option.entryPoint='{name}'" in output, output
    assert str(model_dir.resolve() / name) in output, output
    assert needle in output, output
    if case == "raises at initialisation":
        assert "OSError: cannot read" in output
    if case in ("missing", "no handle"):  # found before the port is bound
        assert "listening" not in output


def test_the_djl_python_stand_in_is_not_installed_by_importing_shoal():
    code = ("import shoal, shoal.llm.serving, shoal.serving, sys; "
            "print(json.dumps('djl_python' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", f"import json; {code}"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert json.loads(out) is False
