"""The fine-tuning recipe's options, data shapes, job arguments and serving.properties: no
torch, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.errors import InvalidArgumentError
from shoal.llm._data import detect_format, load_records, split
from shoal.llm._job import parse_hyperparameters
from shoal.llm._options import DataFormat, FineTuneMethod, FineTuneOptions
from shoal.llm._serving import read_serving_properties, write_serving_properties


def test_options_build_from_knobs_and_refuse_unknown_names():
    opts = FineTuneOptions.build(method="lora", r=8, target_modules=["q_proj", "v_proj"])
    assert opts.method is FineTuneMethod.LORA and opts.target_modules == ("q_proj", "v_proj")
    with pytest.raises(InvalidArgumentError, match="unknown fine-tuning option.*rank"):
        FineTuneOptions.build(rank=8)


@pytest.mark.parametrize(("knob", "value", "expected"), [
    ("method", "dora", "qlora, lora"), ("r", 0, "positive integer"),
    ("lora_dropout", 1.5, "[0, 1)"), ("lr_scheduler", "step", "cosine"),
    ("max_steps", True, "positive integer"), ("dtype", "int8", "bfloat16"),
])
def test_bad_options_name_the_option_and_what_it_takes(knob, value, expected):
    with pytest.raises(InvalidArgumentError) as info:
        FineTuneOptions.build(**{knob: value})
    assert f"{knob}={value!r}" in str(info.value) and expected in str(info.value)


def test_options_round_trip_through_job_hyperparameters():
    opts = FineTuneOptions.build(method="lora", max_steps=7, packing=True, learning_rate=1e-3,
                                 target_modules=("q_proj",), eval_steps=None)
    hps = {"method": "lora", **opts.changed()}
    text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in hps.items()}
    assert FineTuneOptions.from_strings(text) == opts
    assert FineTuneOptions.from_strings({"target_modules": "q_proj,v_proj"}).target_modules \
        == ("q_proj", "v_proj")


def test_job_arguments_are_key_value_pairs():
    assert parse_hyperparameters(["--base_model", "m", "--max_steps", "3"]) == {
        "base_model": "m", "max_steps": "3"}
    with pytest.raises(InvalidArgumentError, match="--key value"):
        parse_hyperparameters(["--dangling"])


@pytest.mark.parametrize(("record", "shape"), [
    ({"text": "x"}, DataFormat.TEXT),
    ({"prompt": "p", "completion": "c"}, DataFormat.PROMPT_COMPLETION),
    ({"instruction": "i", "context": "", "response": "r", "category": "qa"},
     DataFormat.INSTRUCTION),
    ({"messages": [{"role": "user", "content": "hi"}]}, DataFormat.CHAT),
])
def test_record_shapes_are_detected_from_their_fields(record, shape):
    assert detect_format([record], DataFormat.AUTO, "data.jsonl") is shape


def test_a_requested_shape_the_records_lack_names_their_fields():
    with pytest.raises(InvalidArgumentError, match="data_format=chat.*prompt"):
        detect_format([{"prompt": "p", "completion": "c"}], DataFormat.CHAT, "d.jsonl")


def test_jsonl_errors_name_the_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json}\n')
    with pytest.raises(InvalidArgumentError, match=r"bad\.jsonl:2"):
        load_records(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="neither JSONL files nor a datasets"):
        load_records(tmp_path / "empty")


def test_a_folder_of_jsonl_files_is_one_dataset(tmp_path: Path):
    for i in range(2):
        (tmp_path / f"part-{i}.jsonl").write_text(json.dumps({"text": str(i)}) + "\n")
    records, validation = load_records(tmp_path)
    assert [r["text"] for r in records] == ["0", "1"] and validation is None


def test_validation_split_is_seeded_and_keeps_a_training_record():
    rows = [{"text": str(i)} for i in range(10)]
    train, val = split(rows, 0.2, seed=1)
    assert len(val) == 2 and len(train) == 8 and split(rows, 0.2, seed=1) == (train, val)
    assert split(rows[:2], 0.9, seed=1)[0]


def test_serving_properties_round_trip(tmp_path: Path):
    write_serving_properties(tmp_path, {"option.dtype": "bf16", "engine": "Python",
                                        "option.trust_remote_code": False})
    text = (tmp_path / "serving.properties").read_text()
    assert text.splitlines()[0] == "engine=Python"
    assert read_serving_properties(tmp_path) == {"engine": "Python", "option.dtype": "bf16",
                                                 "option.trust_remote_code": "false"}

