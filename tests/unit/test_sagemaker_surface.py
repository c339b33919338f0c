"""Issue #22, items 1-3: SageMaker v2 code that does ``import shoal as sagemaker`` (or changes
``sagemaker`` to ``shoal`` in its import lines) finds the modules, names and Session it uses.
Written in the way notebooks use the SDK; everything runs on real files."""

from __future__ import annotations

import importlib
import inspect
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import shoal as sagemaker
from shoal.errors import InvalidArgumentError

# SageMaker v2's public import paths that examples use: `from sagemaker.X import Y`.
SAGEMAKER_PATHS = [
    ("sagemaker", "Session"), ("sagemaker", "get_execution_role"), ("sagemaker", "Model"),
    ("sagemaker", "Predictor"), ("sagemaker", "TrainingInput"),
    ("sagemaker.session", "Session"), ("sagemaker.session", "get_execution_role"),
    ("sagemaker.estimator", "Estimator"), ("sagemaker.estimator", "Framework"),
    ("sagemaker.inputs", "TrainingInput"), ("sagemaker.model", "Model"),
    ("sagemaker.model", "FrameworkModel"), ("sagemaker.predictor", "Predictor"),
    ("sagemaker.image_uris", "retrieve"),
    ("sagemaker.utils", "name_from_base"), ("sagemaker.utils", "unique_name_from_base"),
    ("sagemaker.utils", "base_name_from_image"), ("sagemaker.utils", "sagemaker_timestamp"),
    ("sagemaker.s3", "S3Uploader"), ("sagemaker.s3", "S3Downloader"),
    ("sagemaker.s3", "s3_path_join"), ("sagemaker.s3", "parse_s3_url"),
    ("sagemaker.sklearn", "SKLearn"), ("sagemaker.sklearn", "SKLearnModel"),
    ("sagemaker.sklearn.estimator", "SKLearn"), ("sagemaker.sklearn.model", "SKLearnModel"),
    ("sagemaker.sklearn.model", "SKLearnPredictor"),
    ("sagemaker.pytorch", "PyTorch"), ("sagemaker.pytorch", "PyTorchModel"),
    ("sagemaker.pytorch.estimator", "PyTorch"), ("sagemaker.pytorch.model", "PyTorchModel"),
    ("sagemaker.pytorch.model", "PyTorchPredictor"),
    ("sagemaker.huggingface", "HuggingFace"), ("sagemaker.huggingface", "HuggingFaceModel"),
    ("sagemaker.huggingface", "get_huggingface_llm_image_uri"),
    ("sagemaker.huggingface.model", "HuggingFaceModel"),
    ("sagemaker.huggingface.model", "HuggingFacePredictor"),
    ("sagemaker.huggingface.estimator", "HuggingFace"),
    ("sagemaker.huggingface.llm_utils", "get_huggingface_llm_image_uri"),
    ("sagemaker.djl_inference", "DJLModel"), ("sagemaker.djl_inference", "DJLPredictor"),
    ("sagemaker.djl_inference.model", "DJLModel"),
    ("sagemaker.remote_function", "remote"), ("sagemaker.remote_function", "RemoteExecutor"),
    ("sagemaker.remote_function", "CheckpointLocation"),
    ("sagemaker.remote_function.client", "remote"),
    ("sagemaker.remote_function.client", "RemoteExecutor"),
    ("sagemaker.remote_function.client", "get_future"),
    ("sagemaker.remote_function.client", "list_futures"),
    ("sagemaker.remote_function.custom_file_filter", "CustomFileFilter"),
    ("sagemaker.remote_function.checkpoint_location", "CheckpointLocation"),
    ("sagemaker.experiments", "Run"), ("sagemaker.experiments", "load_run"),
    ("sagemaker.experiments.run", "Run"), ("sagemaker.experiments.run", "load_run"),
    ("sagemaker.experiments.trial_component", "_TrialComponent"),
    ("sagemaker.analytics", "ExperimentAnalytics"),
    ("sagemaker.config", "load_sagemaker_config"),
    *[("sagemaker.serializers", n) for n in (
        "BaseSerializer", "SimpleBaseSerializer", "CSVSerializer", "JSONSerializer",
        "NumpySerializer", "IdentitySerializer", "JSONLinesSerializer", "StringSerializer",
        "DataSerializer", "LibSVMSerializer", "SparseMatrixSerializer",
        "TorchTensorSerializer")],
    *[("sagemaker.deserializers", n) for n in (
        "BaseDeserializer", "SimpleBaseDeserializer", "CSVDeserializer", "JSONDeserializer",
        "NumpyDeserializer", "BytesDeserializer", "StringDeserializer", "StreamDeserializer",
        "PandasDeserializer", "JSONLinesDeserializer", "TorchTensorDeserializer")],
]


@pytest.mark.parametrize(("module", "name"), SAGEMAKER_PATHS,
                         ids=[f"{m}.{n}" for m, n in SAGEMAKER_PATHS])
def test_every_sagemaker_import_path_resolves_under_shoal(module, name):
    ported = "shoal" + module[len("sagemaker"):]
    value = getattr(importlib.import_module(ported), name)
    assert value is not None
    if inspect.isclass(value) or inspect.isfunction(value):
        assert value.__module__.startswith("shoal"), value


def test_import_shoal_as_sagemaker_loads_submodules_on_first_use():
    code = ("import sys, shoal as sagemaker\n"
            "before = sorted(m for m in ('shoal.s3', 'shoal.image_uris', 'shoal.utils', "
            "'fsspec') if m in sys.modules)\n"
            "sagemaker.s3.S3Uploader; sagemaker.image_uris.retrieve; sagemaker.utils.name_from_base\n"
            "print(before, 'shoal.s3' in sys.modules, 'image_uris' in dir(sagemaker))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert shown == "[] True True"


def test_a_notebook_preamble_runs(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    sess = sagemaker.Session(home=str(tmp_path / "h"))
    role = sagemaker.get_execution_role()
    again = sagemaker.get_execution_role(sess)
    bucket = sess.default_bucket()
    region = sess.boto_region_name
    assert role == again and role.startswith("arn:aws:iam::") and ":role/" in role
    reports = [r for r in caplog.records if "get_execution_role" in r.getMessage()]
    assert len(reports) <= 1  # once per process (the first test to call it saw it)
    assert bucket == (tmp_path / "h" / "artifacts").as_uri()
    assert isinstance(region, str) and region
    assert len(sess.account_id()) == 12 and sess.account_id().isdigit()
    name = sagemaker.utils.name_from_base("sklearn-demo")
    assert name.startswith("sklearn-demo-") and len(name) <= 63
    long = sagemaker.utils.unique_name_from_base("x" * 80)
    assert len(long) == 63 and long != sagemaker.utils.unique_name_from_base("x" * 80)
    assert sagemaker.utils.base_name_from_image(
        "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"
    ) == "sagemaker-scikit-learn"
    assert sagemaker.utils.base_from_name(name) == "sklearn-demo"


def test_session_takes_sagemakers_arguments_in_its_order(tmp_path, caplog):
    params = list(inspect.signature(sagemaker.Session).parameters)
    assert params[:9] == ["boto_session", "sagemaker_client", "sagemaker_runtime_client",
                          "sagemaker_featurestore_runtime_client", "default_bucket",
                          "settings", "sagemaker_metrics_client", "sagemaker_config",
                          "default_bucket_prefix"]
    caplog.set_level(logging.WARNING)
    client = object()  # stands in for boto3.client("sagemaker"): no AWS account here
    sess = sagemaker.Session(None, client, sagemaker_runtime_client=client,
                             default_bucket=str(tmp_path / "bucket"),
                             default_bucket_prefix="team-a", home=str(tmp_path / "h"))
    assert sess.aws_clients == {"sagemaker_client": client, "sagemaker_runtime_client": client}
    assert any("sagemaker_client" in r.getMessage() and "no effect" in r.getMessage()
               for r in caplog.records)
    assert sess.default_bucket_prefix == "team-a"
    up = list(inspect.signature(sagemaker.Session.upload_data).parameters)
    assert up == ["self", "path", "bucket", "key_prefix", "callback", "extra_args"]

    data = tmp_path / "train"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n")
    (data / "sub").mkdir()
    (data / "sub" / "b.csv").write_text("3,4\n")
    sizes: list[int] = []
    uri = sess.upload_data(str(data), None, "data/train", sizes.append)  # positional callback
    assert uri == f"{tmp_path / 'bucket'}/team-a/data/train"
    assert sorted(sizes) == [4, 4]
    keys = sess.list_s3_files(str(tmp_path / "bucket"), "team-a/data")
    assert keys == ["team-a/data/train/a.csv", "team-a/data/train/sub/b.csv"]
    assert sess.read_s3_file(str(tmp_path / "bucket"), keys[1]) == "3,4\n"
    got = sess.download_data(str(tmp_path / "dl"), str(tmp_path / "bucket"), "team-a/data/train")
    assert sorted(Path(p).relative_to(tmp_path / "dl").as_posix() for p in got) == [
        "a.csv", "sub/b.csv"]
    one = sess.upload_string_as_file_body("hello", str(tmp_path / "bucket"), "notes/n.txt")
    assert Path(one).read_text() == "hello"


def test_s3_uploader_and_downloader_over_fsspec_urls(tmp_path):
    from shoal.s3 import S3Downloader, S3Uploader, s3_path_join

    root = (tmp_path / "store").as_uri()  # file:// URL: the same calls take s3:// URLs
    prefix = s3_path_join(root, "experiments", "run-1")
    assert prefix == f"{root}/experiments/run-1"
    local = tmp_path / "metrics.json"
    local.write_text('{"acc": 0.9}')
    uploaded = S3Uploader.upload(str(local), prefix)
    assert uploaded == f"{prefix}/metrics.json"
    S3Uploader.upload_string_as_file_body("a,b\n1,2\n", f"{prefix}/table.csv")
    S3Uploader.upload_bytes(b"\x00\x01", f"{prefix}/blob.bin")
    assert S3Downloader.list(prefix) == [f"{prefix}/blob.bin", f"{prefix}/metrics.json",
                                         f"{prefix}/table.csv"]
    assert S3Downloader.read_file(f"{prefix}/table.csv") == "a,b\n1,2\n"
    assert S3Downloader.read_bytes(f"{prefix}/blob.bin") == b"\x00\x01"
    paths = S3Downloader.download(prefix, str(tmp_path / "out"))
    assert sorted(Path(p).name for p in paths) == ["blob.bin", "metrics.json", "table.csv"]
    assert (tmp_path / "out" / "metrics.json").read_text() == '{"acc": 0.9}'
    with pytest.raises(Exception, match="no object"):
        S3Downloader.read_file(f"{prefix}/missing.csv")
    assert S3Downloader.list(f"{root}/nothing-here") == []


def test_image_uris_retrieve_names_the_framework_and_estimator_uses_it(tmp_path):
    from shoal.estimator import Estimator
    from shoal.image_uris import parse_image_uri

    uri = sagemaker.image_uris.retrieve(framework="sklearn", region="us-east-1",
                                        version="1.2-1", py_version="py3",
                                        instance_type="ml.m5.xlarge", image_scope="training")
    assert uri == "shoal.local/sklearn-training:1.2-1-cpu-py3"
    gpu = sagemaker.image_uris.retrieve("pytorch", "us-west-2", "2.1.0", "py310", "ml.g5.xlarge",
                                        image_scope="inference")
    assert gpu == "shoal.local/pytorch-inference:2.1.0-gpu-py310"
    assert parse_image_uri(gpu).requirement == ("torch", "==2.1.0")
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    est = Estimator(image_uri=uri, role=sagemaker.get_execution_role(),
                    instance_count=1, instance_type="ml.m5.xlarge", entry_point=str(script))
    assert est._framework == ("scikit-learn", "==1.2.*") and "image_uri" not in est.inert
    ecr = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1"
    other = Estimator(image_uri=ecr, entry_point=str(script))
    assert other._framework is None and other.inert["image_uri"] == ecr
    with pytest.raises(InvalidArgumentError, match="JumpStart"):
        sagemaker.image_uris.retrieve("pytorch", "us-east-1", model_id="meta-textgeneration")


def test_serializers_added_for_sagemaker_names():
    import io

    from shoal.deserializers import JSONLinesDeserializer, PandasDeserializer
    from shoal.serializers import JSONLinesSerializer, StringSerializer

    body = JSONLinesSerializer().serialize([{"a": 1}, {"a": 2}])
    assert body == '{"a": 1}\n{"a": 2}'
    assert JSONLinesDeserializer().deserialize(io.BytesIO(body.encode()),
                                               "application/jsonlines") == [{"a": 1}, {"a": 2}]
    assert StringSerializer().serialize(12) == "12"
    frame = PandasDeserializer().deserialize(io.BytesIO(b"x,y\n1,2\n3,4\n"), "text/csv")
    assert frame["y"].tolist() == [2, 4]


def test_framework_models_take_sagemakers_arguments(tmp_path):
    from shoal.deserializers import NumpyDeserializer
    from shoal.pytorch.model import PyTorchModel
    from shoal.serializers import NumpySerializer
    from shoal.sklearn.model import SKLearnModel, SKLearnPredictor

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.joblib").write_bytes(b"placeholder")
    assert list(inspect.signature(SKLearnModel).parameters)[:8] == [
        "model_data", "role", "entry_point", "framework_version", "py_version", "image_uri",
        "predictor_cls", "model_server_workers"]
    model = SKLearnModel(str(model_dir), sagemaker.get_execution_role(),
                         framework_version="1.2-1", model_server_workers=2)
    assert model.env["SHOAL_MODEL_SERVER_WORKERS"] == "2"
    assert model.predictor_cls is SKLearnPredictor and model.framework_version == "1.2-1"
    predictor = SKLearnPredictor("no-such-endpoint")
    assert isinstance(predictor.serializer, NumpySerializer)
    assert isinstance(predictor.deserializer, NumpyDeserializer)
    assert list(inspect.signature(PyTorchModel).parameters)[:4] == [
        "model_data", "role", "entry_point", "framework_version"]
