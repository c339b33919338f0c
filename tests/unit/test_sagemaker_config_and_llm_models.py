"""Issue #22 items 2 and 5: config files as SageMaker reads them (its override variables, and
edits taking effect at the next use), and the LLM model classes' construction. Real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shoal
from shoal.errors import InvalidArgumentError

CONFIG = """SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      RemoteFunction:
        InstanceType: {itype}
      Session:
        DefaultS3ObjectKeyPrefix: {prefix}
"""


def _write(path: Path, itype: str, prefix: str = "p") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG.format(itype=itype, prefix=prefix))
    return path


def test_sagemaker_user_config_override_is_honoured(tmp_path, monkeypatch):
    config = _write(tmp_path / "project" / "config.yaml", "ml.m5.large")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config.parent))  # a directory
    session = shoal.Session(home=str(tmp_path / "h"))
    assert session.defaults.get("InstanceType") == "ml.m5.large"
    assert session.defaults.remote_function["InstanceType"].source == f"user file {config}"
    admin = _write(tmp_path / "admin.yaml", "ml.c5.xlarge", prefix="admin")
    monkeypatch.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(admin))
    assert session.defaults.get("InstanceType") == "ml.m5.large"  # user file wins
    assert session.default_bucket_prefix == "p"
    monkeypatch.setenv("SHOAL_USER_CONFIG_OVERRIDE", str(tmp_path / "none.yaml"))
    assert shoal.Session(home=str(tmp_path / "h")).defaults.get("InstanceType") == \
        "ml.c5.xlarge"  # SHOAL_* first; that file is missing, so the admin file speaks


def test_a_config_file_created_or_edited_later_takes_effect(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    session = shoal.Session(home=str(tmp_path / "h"))
    assert session.defaults.get("InstanceType") is None  # not there yet
    _write(config, "ml.m5.large")
    assert session.defaults.get("InstanceType") == "ml.m5.large"
    first = config.stat().st_mtime_ns
    _write(config, "ml.m5.2xlarge")  # same size, maybe the same mtime tick
    if config.stat().st_mtime_ns == first:
        os.utime(config, ns=(first + 1_000_000, first + 1_000_000))
    assert session.defaults.get("InstanceType") == "ml.m5.2xlarge"
    assert shoal.Session(home=str(tmp_path / "h2")).defaults.get("InstanceType") == \
        "ml.m5.2xlarge"
    config.unlink()
    assert session.defaults.get("InstanceType") is None


def test_load_sagemaker_config_and_session_sagemaker_config(tmp_path, monkeypatch):
    from shoal.config import load_sagemaker_config

    monkeypatch.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(_write(tmp_path / "a.yaml",
                                                                     "ml.c5.xlarge", "a")))
    extra = _write(tmp_path / "extra.yaml", "ml.m5.large", "e")
    merged = load_sagemaker_config(additional_config_paths=[str(extra)])
    modules = merged["SageMaker"]["PythonSDK"]["Modules"]
    assert modules["RemoteFunction"]["InstanceType"] == "ml.m5.large"
    assert modules["Session"]["DefaultS3ObjectKeyPrefix"] == "e"
    session = shoal.Session(sagemaker_config=merged, home=str(tmp_path / "h"))
    assert session.defaults.get("InstanceType") == "ml.m5.large"
    with pytest.raises(shoal.ShoalError, match="does not exist"):
        load_sagemaker_config(additional_config_paths=[str(tmp_path / "missing.yaml")])


def test_djl_model_from_a_model_id_writes_serving_properties(tmp_path):
    from shoal.djl_inference import DJLModel

    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    model = DJLModel(model_id=str(weights), dtype="fp32", tensor_parallel_degree=1,
                     sagemaker_session=shoal.Session(home=str(tmp_path / "h")))
    assert model.serving_properties() == {"engine": "Python", "option.dtype": "fp32",
                                          "option.model_id": str(weights.resolve()),
                                          "option.tensor_parallel_degree": "1"}
    served = tmp_path / "served"
    served.mkdir()
    (served / "serving.properties").write_text("engine=Python\noption.model_id=.\n")
    over = DJLModel(model_data=str(served), dtype="bf16")
    assert over.model_data == str(served) and over.env["OPTION_DTYPE"] == "bf16"
    with pytest.raises(InvalidArgumentError, match="DJLModel needs model_id"):
        DJLModel()


def test_hugging_face_model_from_an_uncached_hub_id_fails_clearly(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from shoal.huggingface import HuggingFaceModel, get_huggingface_llm_image_uri

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    image = get_huggingface_llm_image_uri("huggingface", version="2.0.2")
    with pytest.raises(InvalidArgumentError) as info:
        HuggingFaceModel(role=shoal.get_execution_role(), image_uri=image,
                         env={"HF_MODEL_ID": "acme/never-downloaded", "SM_NUM_GPUS": "1"})
    message = str(info.value)
    assert "acme/never-downloaded" in message and "empty-cache" in message
    assert "no network" in message
    with pytest.raises(InvalidArgumentError, match="text-classification"):
        HuggingFaceModel(model_data=str(tmp_path), env={"HF_TASK": "text-classification"})


def test_hugging_face_model_over_a_model_directory(tmp_path):
    from shoal.huggingface import HuggingFaceModel

    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    model = HuggingFaceModel(model_data=str(weights), transformers_version="4.37",
                             env={"MAX_TOTAL_TOKENS": "256", "HF_TASK": "text-generation"},
                             sagemaker_session=shoal.Session(home=str(tmp_path / "h")))
    from shoal.llm import read_serving_properties

    props = read_serving_properties(Path(model.model_data))
    assert props == {"engine": "Python", "option.max_model_len": "256",
                     "option.model_id": str(weights.resolve())}
    assert model.transformers_version == "4.37"


def test_hugging_face_model_asks_the_llm_server_for_tgis_answer(tmp_path):
    from shoal.huggingface import HuggingFaceModel, get_huggingface_llm_image_uri
    from shoal.llm.serving import load_serving_options

    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    session = shoal.Session(home=str(tmp_path / "h"))
    tgi = HuggingFaceModel(model_data=str(weights), sagemaker_session=session,
                           image_uri=get_huggingface_llm_image_uri("huggingface"))
    assert tgi.env["OPTION_TGI_COMPAT"] == "true" == tgi.env["OPTION_RETURN_FULL_TEXT"]
    served = load_serving_options(Path(tgi.model_data), tgi.env)  # what the server reads
    assert served.tgi_compat and served.return_full_text
    t2t = HuggingFaceModel(model_data=str(weights), sagemaker_session=session,
                           env={"HF_TASK": "text2text-generation",
                                "OPTION_TGI_COMPAT": "false"})
    assert t2t.env["OPTION_RETURN_FULL_TEXT"] == "false"  # TGI: only text-generation
    assert t2t.env["OPTION_TGI_COMPAT"] == "false"  # the caller's variable wins
    lmi = HuggingFaceModel(model_data=str(weights), sagemaker_session=session,
                           image_uri=get_huggingface_llm_image_uri("lmi"))
    assert not {"OPTION_TGI_COMPAT", "OPTION_RETURN_FULL_TEXT"} & set(lmi.env)


def test_trial_component_reads_a_run(tmp_path):
    from shoal.experiments import Run
    from shoal.experiments.trial_component import _TrialComponent

    session = shoal.Session(home=str(tmp_path / "h"))
    with Run(experiment_name="churn", run_name="baseline", sagemaker_session=session) as run:
        run.log_parameter("max_depth", 4)
        run.log_metric("auc", 0.8)
    component = _TrialComponent.load("churn-baseline", sagemaker_session=session)
    assert component.parameters == {"max_depth": 4}
    assert component.status == {"PrimaryStatus": "Completed"}
    assert [m["MetricName"] for m in component.metrics] == ["auc"]
    names = [s.trial_component_name for s in
             _TrialComponent.list(experiment_name="churn", sagemaker_session=session)]
    assert names == ["churn-baseline"]
    with pytest.raises(shoal.NotFoundError):
        _TrialComponent.load("churn-nope", sagemaker_session=session)
