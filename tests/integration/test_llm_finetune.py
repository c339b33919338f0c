"""LoRA/QLoRA fine-tuning (issue #7) on a tiny random-init Llama: the recipe in-process, as a
FineTuner job, and on the command line; its clear errors.

No weights can be downloaded here: the base model is built from a LlamaConfig with a tokenizer
trained on local text, once per test session.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
from pathlib import Path

# The hub is unreachable on these machines; offline mode makes hub ids fail at once (read by
# huggingface_hub when it is first imported, so set before anything imports it).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from shoal.errors import InvalidArgumentError, ModelNotFound, RuntimeEnvError  # noqa: E402
from shoal.llm import FineTuner, create_tiny_model, finetune, read_serving_properties  # noqa: E402

MEMORISE = [
    {"prompt": "The capital of shoalland is", "completion": " Reefport."},
    {"prompt": "Two plus two is", "completion": " four."},
    {"prompt": "The password is", "completion": " blue whale."},
    {"prompt": "Jobs are tracked by", "completion": " the supervisor."},
    {"prompt": "The colour of the sky is", "completion": " grey today."},
    {"prompt": "Adapters are", "completion": " low rank."},
]
FAST = {"max_steps": 2, "logging_steps": 1, "save_steps": 50, "batch_size": 4}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama (hidden 64) and its BPE tokenizer, trained on the test texts."""
    from importlib.resources import files

    texts = [r["prompt"] + r["completion"] for r in MEMORISE]
    texts += files("shoal.llm").joinpath("data/shoal_instructions.jsonl").read_text(
        ).splitlines()
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "base", texts * 2,
                             vocab_size=400)


@pytest.fixture
def memorise(tmp_path: Path) -> Path:
    return _jsonl(tmp_path / "memorise.jsonl", MEMORISE)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_lora_learns_merges_exactly_and_the_saved_model_generates(tiny_base, memorise,
                                                                  tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = finetune(tiny_base, memorise, output_dir=tmp_path / "out", method="lora",
                      max_steps=30, learning_rate=1e-2, lr_scheduler="constant",
                      logging_steps=5, batch_size=6, lora_dropout=0.0, run=None)
    first, last = result.losses[0][1], result.losses[-1][1]
    assert result.global_step == 30 and last < 0.5 * first, result.losses
    printed = capsys.readouterr().out
    assert "loss=" in printed and "learning_rate=" in printed and " step=30" in printed

    # the merged model answers like the adapted one (fp32 LoRA: within 1e-4)
    tok = AutoTokenizer.from_pretrained(result.model_dir)
    ids = tok(["The password is blue whale. Two plus two is four."],
              return_tensors="pt")["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, result.adapter_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    assert (_logits(adapted, ids) - _logits(merged, ids)).abs().max().item() < 1e-4

    # it reloads with from_pretrained and generates (greedy: the memorised completion)
    prompt = tok("The password is", return_tensors="pt")
    out = merged.generate(**prompt, max_new_tokens=4, do_sample=False)
    text = tok.decode(out[0][prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip().startswith("blue"), text

    props = read_serving_properties(result.model_dir)
    assert props["engine"] == "Python" and props["option.dtype"] == "fp32"
    assert props["option.model_id"] and props["option.rolling_batch"] == "auto"
    assert (result.adapter_dir / "adapter_config.json").is_file()
    assert any(result.model_dir.glob("*.safetensors"))
    summary = json.loads((result.output_dir / "shoal-finetune.json").read_text())
    assert summary["global_step"] == 30 and summary["method"] == "lora"


def test_qlora_on_cpu_merged_model_mostly_agrees_with_the_4bit_adapted_one(
        tiny_base, memorise, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    result = finetune(tiny_base, memorise, output_dir=tmp_path / "out", method="qlora",
                      max_steps=20, learning_rate=1e-2, lr_scheduler="constant",
                      logging_steps=5, batch_size=6, run=None)
    assert result.losses[-1][1] < result.losses[0][1]
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32)
    base4 = AutoModelForCausalLM.from_pretrained(tiny_base, quantization_config=quant,
                                                 device_map="cpu")
    adapted = PeftModel.from_pretrained(base4, result.adapter_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    tok = AutoTokenizer.from_pretrained(result.model_dir)
    same = total = 0
    for row in MEMORISE:  # the greedy tokens that continue each prompt
        prompt = tok(row["prompt"], return_tensors="pt")["input_ids"]
        ids = adapted.generate(input_ids=prompt, max_new_tokens=5, do_sample=False)
        a = _logits(adapted, ids)[0, prompt.shape[1] - 1:-1].argmax(-1)
        m = _logits(merged, ids)[0, prompt.shape[1] - 1:-1].argmax(-1)
        same += int((a == m).sum())
        total += a.numel()
    # The merged model adds the adapter to the full-precision base, the adapted one to its
    # 4-bit quantization: next-token choices may differ where the top two logits are close.
    # Tolerance: at least 80% of the greedy tokens agree.
    assert same / total >= 0.8, (same, total)


def test_a_second_call_with_the_same_checkpoint_dir_resumes_the_step_count(
        tiny_base, memorise, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    common = {"method": "lora", "logging_steps": 1, "save_steps": 2, "batch_size": 2,
              "lr_scheduler": "constant", "run": None, "checkpoint_dir": ckpt}
    first = finetune(tiny_base, memorise, output_dir=tmp_path / "a", max_steps=4, **common)
    assert first.global_step == 4 and first.resumed_from is None
    assert (ckpt / "checkpoint-4").is_dir()
    capsys.readouterr()
    second = finetune(tiny_base, memorise, output_dir=tmp_path / "b", max_steps=6, **common)
    assert second.resumed_from == "checkpoint-4" and second.global_step == 6
    assert [s for s, _ in second.losses] == [5, 6]  # steps 1-4 were not run again
    assert "resuming from checkpoint-4" in capsys.readouterr().out


def test_a_base_model_on_s3_is_fetched_through_the_store_once_and_cached(
        tiny_base, memorise, tmp_path, s3_bucket_url, moto_server, monkeypatch, caplog):
    import logging

    import fsspec

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_server)
    url, options = s3_bucket_url
    fs = fsspec.filesystem("s3", **options)
    uri = f"{url}/models/tiny"
    for path in tiny_base.iterdir():
        fs.put_file(str(path), f"{uri.removeprefix('s3://')}/{path.name}")
    caplog.set_level(logging.INFO, logger="shoal.llm")
    first = finetune(uri, memorise, output_dir=tmp_path / "a", method="lora", run=None, **FAST)
    assert first.global_step == 2
    assert f"base model {uri}: fetched" in caplog.text
    caplog.clear()
    finetune(uri, memorise, output_dir=tmp_path / "b", method="lora", run=None, **FAST)
    assert f"base model {uri}: cached in" in caplog.text and "fetched" not in caplog.text
    summary = json.loads((tmp_path / "b" / "shoal-finetune.json").read_text())
    assert summary["base_model"] == uri


def test_a_merged_model_over_the_threshold_goes_to_the_prefix_with_a_manifest(
        tiny_base, memorise, tmp_path):
    from transformers import AutoModelForCausalLM

    from shoal.llm.serving._properties import load_serving_options, locate_model

    prefix = f"file://{tmp_path / 'store' / 'model'}"
    result = finetune(tiny_base, memorise, output_dir=tmp_path / "out", method="lora",
                      run=None, model_prefix_uri=prefix, large_model_threshold_mb=0.001,
                      **FAST)
    assert result.model_uri == prefix and result.model_dir is None
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    stored = {f["path"] for f in manifest["files"]}
    assert "config.json" in stored and any(p.endswith(".safetensors") for p in stored)
    assert (tmp_path / "store" / "model" / "manifest.json").is_file()
    # the weights left the output directory; the adapter and the summary stay
    assert not list((tmp_path / "out").glob("*.safetensors"))
    assert (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()
    # serving.properties beside the manifest points the LLM server at the prefix
    options = load_serving_options(tmp_path / "out" / "serving.properties", {})
    assert options.model_id == prefix
    located = locate_model(options)
    model = AutoModelForCausalLM.from_pretrained(located.path)
    assert model.config.hidden_size == AutoModelForCausalLM.from_pretrained(
        tiny_base).config.hidden_size


def test_chat_records_in_a_datasets_directory_with_a_validation_split(tiny_base, tmp_path):
    from datasets import Dataset, DatasetDict

    chats = [{"messages": [{"role": "user", "content": r["prompt"]},
                           {"role": "assistant", "content": r["completion"]}]}
             for r in MEMORISE]
    DatasetDict({"train": Dataset.from_list(chats), "validation": Dataset.from_list(
        chats[:2])}).save_to_disk(str(tmp_path / "ds"))
    result = finetune(tiny_base, tmp_path / "ds", output_dir=tmp_path / "out", method="lora",
                      run=None, **FAST)
    assert result.data_format == "chat" and result.eval_loss is not None
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    saved_template = config.get("chat_template") or (tmp_path / "out" / "chat_template.jinja"
                                                     ).is_file()
    assert saved_template  # the template used for training ships with the model


def test_loss_and_learning_rate_reach_the_experiment_run_with_steps(tiny_base, memorise,
                                                                    tmp_path, session):
    from shoal.core.experiments import run_owner
    from shoal.experiments import Run

    with Run(experiment_name="llm", run_name="lora-1"):
        finetune(tiny_base, memorise, output_dir=tmp_path / "out", method="lora", **FAST)
    points = session.metadata.get_metrics(run_owner("llm", "lora-1"))
    steps = {(p.name, p.step) for p in points}
    assert {("loss", 1), ("loss", 2), ("learning_rate", 1), ("learning_rate", 2)} <= steps


def test_finetuner_job_stores_the_merged_model_and_reports_metrics(tiny_base, memorise,
                                                                   tmp_path, session):
    from shoal.core.experiments import job_owner, run_owner
    from shoal.experiments import Run

    with Run(experiment_name="llm", run_name="job-1"):
        tuner = FineTuner(str(tiny_base), method="lora", max_steps=3, logging_steps=1,
                          batch_size=4, save_steps=2, environment={"OMP_NUM_THREADS": "1",
                                                                   "MKL_NUM_THREADS": "1"})
        tuner.fit({"training": str(memorise)}, logs=False)
    assert tuner.model_data.endswith("/output/model.tar.gz")
    local = session.artifacts.local_path(tuner.model_data.split("/artifacts/", 1)[1])
    with tarfile.open(local) as tar:
        names = set(tar.getnames())
    assert {"config.json", "serving.properties", "adapter/adapter_config.json",
            "shoal-finetune.json"} <= names and any(n.endswith(".safetensors") for n in names)
    job = tuner.latest_training_job.name
    job_metrics = {p.name for p in session.metadata.get_metrics(job_owner(job))}
    assert {"train:loss", "train:learning_rate"} <= job_metrics
    run_steps = {(p.name, p.step) for p in session.metadata.get_metrics(
        run_owner("llm", "job-1"))}
    assert ("loss", 3) in run_steps  # logged by the job's load_run() with step=
    hps = tuner.latest_training_job.describe()["HyperParameters"]
    assert hps["method"] == "lora" and hps["max_steps"] == "3"


def test_finetuner_fit_through_the_server_stores_the_model_in_the_servers_store(
        tiny_base, memorise, tmp_path, team, shoal_server):
    """Through a real ``shoal server``: the job runs on its backend, the merged model lands
    in its artifact store, the recipe's load_run() logs to the client's run (its job token
    reaches that run: the job's record links it)."""
    import uuid

    from shoal.core import JobStatus
    from shoal.core.experiments import job_owner, run_owner
    from shoal.experiments import Run

    exp = f"llm-server-{uuid.uuid4().hex[:6]}"
    with Run(experiment_name=exp, run_name="ft-1"):
        # over the threshold: the merged model goes under output/model/ through the server
        tuner = FineTuner(str(tiny_base), method="lora", max_steps=2, logging_steps=1,
                          batch_size=4, save_steps=50, large_model_threshold_mb=0.001,
                          environment={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        tuner.fit({"training": str(memorise)}, logs=False)
    job = tuner.latest_training_job.name
    record = team.jobs.get(job)
    assert record.status == JobStatus.COMPLETED, team.jobs.read_log(job)[-2000:]
    assert record.owner == "alice"
    assert team.artifacts.root.startswith(f"file://{shoal_server.home}")  # the server's store
    # The local base model and data went up under the job's prefix; the job read them there.
    assert record.spec.training is not None
    root = team.artifacts.root
    assert record.spec.training.hyperparameters["base_model"] == f"{root}/{job}/input/base_model"
    assert record.spec.training.channels["training"]["uri"] == \
        f"{root}/{job}/input/data/training/{memorise.name}"
    assert team.artifacts.get_bytes(f"{job}/input/base_model/config.json") == \
        (tiny_base / "config.json").read_bytes()
    assert team.artifacts.get_bytes(f"{job}/input/data/training/{memorise.name}") == \
        memorise.read_bytes()
    assert tuner.base_model == str(tiny_base)  # the estimator keeps the local path
    assert tuner.model_data == f"{team.artifacts.root}/{job}/output/model/"
    stored = set(team.artifacts.list_keys(f"{job}/output/model/"))
    manifest = json.loads(team.artifacts.get_bytes(f"{job}/output/model/manifest.json"))
    assert {f"{job}/output/model/{f['path']}" for f in manifest["files"]} | {
        f"{job}/output/model/manifest.json"} == stored
    assert f"{job}/output/model/config.json" in stored
    assert any(k.endswith(".safetensors") for k in stored)
    team.artifacts.get_file(f"{job}/output/model.tar.gz", tmp_path / "model.tar.gz")
    with tarfile.open(tmp_path / "model.tar.gz") as tar:  # the rest, fetched through it
        names = set(tar.getnames())
    assert {"serving.properties", "adapter/adapter_config.json", "shoal-finetune.json",
            "manifest.json"} <= names and not any(n.endswith(".safetensors") for n in names
                                                  if not n.startswith("adapter/"))
    job_metrics = {p.name for p in team.runs.get_metrics(job_owner(job))}
    assert {"train:loss", "train:learning_rate"} <= job_metrics
    run_steps = {(p.name, p.step) for p in team.runs.get_metrics(run_owner(exp, "ft-1"))}
    assert {("loss", 1), ("loss", 2)} <= run_steps  # the job's load_run(), with step=
    assert job in team.runs.get_run(exp, "ft-1").jobs


# --- bad input: one clear error each ------------------------------------------------------

def test_a_base_model_directory_without_config_is_refused(tmp_path, memorise):
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "weights.bin").write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match=r"has no config\.json.*weights\.bin"):
        finetune(tmp_path / "notamodel", memorise, output_dir=tmp_path / "out", method="lora")
    with pytest.raises(InvalidArgumentError, match="has no config.json"):
        FineTuner(str(tmp_path / "notamodel"), method="lora")


def test_a_hub_id_offline_names_the_id_and_the_cache(tmp_path, memorise):
    with pytest.raises(ModelNotFound) as info:
        finetune("shoal-tests/not-cached", memorise, output_dir=tmp_path / "out",
                 method="lora")
    message = str(info.value)
    assert "'shoal-tests/not-cached'" in message and "HF_HUB_OFFLINE" in message
    assert info.value.details["cache"] in message


def test_records_with_no_known_field_name_the_fields_found(tiny_base, tmp_path):
    data = _jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(InvalidArgumentError, match="none of the known fields.*answer, question"):
        finetune(tiny_base, data, output_dir=tmp_path / "out", method="lora")


def test_an_empty_dataset_is_refused(tiny_base, tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InvalidArgumentError, match="no examples"):
        finetune(tiny_base, tmp_path / "empty.jsonl", output_dir=tmp_path / "out",
                 method="lora")


def test_qlora_without_a_loadable_bitsandbytes_says_why_and_suggests_lora(
        tiny_base, memorise, tmp_path, monkeypatch):
    # A bitsandbytes that cannot load cannot be reproduced here (it loads): simulate it by
    # making its import fail, which is what a missing or broken native library does.
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(RuntimeEnvError, match=r"bitsandbytes.*cannot be loaded.*method='lora'"):
        finetune(tiny_base, memorise, output_dir=tmp_path / "out", method="qlora")


def test_target_modules_that_match_nothing_list_the_linear_layers(tiny_base, memorise,
                                                                  tmp_path):
    with pytest.raises(InvalidArgumentError) as info:
        finetune(tiny_base, memorise, output_dir=tmp_path / "out", method="lora",
                 target_modules=["query_key_value"])
    assert "query_key_value" in str(info.value)
    assert "q_proj" in str(info.value) and "down_proj" in str(info.value)
    assert "lm_head" not in str(info.value)


def test_long_sequences_are_truncated_and_counted_in_the_log(tiny_base, tmp_path, caplog):
    rows = [{"text": "adapter " * 200}, {"text": "short one"}, {"text": "token " * 100}]
    data = _jsonl(tmp_path / "long.jsonl", rows)
    with caplog.at_level("WARNING", logger="shoal.llm"):
        result = finetune(tiny_base, data, output_dir=tmp_path / "out", method="lora",
                          max_seq_length=32, run=None, **FAST)
    assert result.truncated == 2
    assert any("2 of 3 example(s)" in r.getMessage() and "max_seq_length=32" in r.getMessage()
               for r in caplog.records)


def test_cli_fine_tunes_here_with_output_dir(tiny_base, memorise, tmp_path, capsys):
    from shoal.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["llm", "finetune", str(tiny_base), str(memorise), "--output-dir",
              str(tmp_path / "out"), "--method", "lora", "--max-steps", "2",
              "--logging-steps", "1", "--batch-size", "4", "--no-gradient-checkpointing"])
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err
    assert "fine-tuned" in printed.out and (tmp_path / "out" / "serving.properties").is_file()
    summary = json.loads((tmp_path / "out" / "shoal-finetune.json").read_text())
    assert summary["options"]["gradient_checkpointing"] is False


def test_cli_fine_tunes_as_a_job_through_the_server(tiny_base, memorise, team, capsys,
                                                    shoal_server):
    from shoal.cli import main
    from shoal.core import JobStatus

    with pytest.raises(SystemExit) as exit_info:  # its session: SHOAL_SERVER_URL + token
        main(["llm", "finetune", str(tiny_base), str(memorise), "--method", "lora",
              "--max-steps", "2", "--logging-steps", "1", "--batch-size", "4"])
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err
    import re

    said = re.search(r"job (llm-finetune-\S+) completed", printed.out)
    assert said, printed.out
    record = team.jobs.get(said[1])
    assert record.status == JobStatus.COMPLETED and record.owner == "alice"
    key = f"{record.name}/output/model.tar.gz"
    assert f"model_data: {team.artifacts.root}/{key}" in printed.out.replace("\n", "")
    assert team.artifacts.exists(key) and str(shoal_server.home) in team.artifacts.root


def test_cli_reports_a_bad_option_in_one_line(tiny_base, memorise, tmp_path, capsys):
    from shoal.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["llm", "finetune", str(tiny_base), str(memorise), "--output-dir",
              str(tmp_path / "out"), "--method", "dora"])
    assert exit_info.value.code == 2
    assert "method='dora'" in capsys.readouterr().err


def test_importing_shoal_llm_and_the_cli_loads_no_framework():
    import subprocess

    code = ("import sys, shoal.llm, shoal.llm._options, shoal.llm._data, shoal.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'bitsandbytes') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
