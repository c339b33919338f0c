"""Issue #22: SageMaker's LLM deployment idioms, live. A ``HuggingFaceModel`` over a model
directory, a ``model.tar.gz`` or ``env={"HF_MODEL_ID": ...}``, a ``DJLModel(model_id=...)``, and
a ``HuggingFace`` estimator whose ``deploy()`` makes a ``HuggingFaceModel``: each deploys the
tiny local Llama on shoal's LLM server, answers ``{"inputs", "parameters"}`` with generated
text, and ``delete_endpoint()`` leaves no record and no process. Written as the SageMaker
notebooks do it (``import shoal as sagemaker``), with few tokens."""

from __future__ import annotations

import os
import tarfile
import textwrap
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import shoal as sagemaker  # noqa: E402
from helpers import wait_until  # noqa: E402
from llm_models import CHAT_TEMPLATE, MAX_POSITIONS, TEXTS, Reference  # noqa: E402
from shoal.djl_inference import DJLModel, DJLPredictor  # noqa: E402
from shoal.huggingface import HuggingFace, HuggingFaceModel, HuggingFacePredictor  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = "The shoal swims past"
PAYLOAD = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "do_sample": False}}
# Few threads per server: the suite shares the machine.
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``save_pretrained`` leaves: weights, config and tokenizer, no serving.properties."""
    from shoal.llm import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("hf") / "tiny-llama", TEXTS * 3,
                             vocab_size=400, hidden_size=64, num_layers=2,
                             max_positions=MAX_POSITIONS, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def expected(hf_model_dir: Path) -> str:
    return Reference(hf_model_dir).text(PROMPT, 4)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _predict_then_delete(session, predictor, expected: str, *, tgi: bool = True) -> None:
    """The notebook's last cells: one request, then the clean-up; nothing may be left. A
    HuggingFaceModel answers as TGI's container (a one-element list, the prompt prepended
    unless return_full_text is false), a DJLModel as LMI (an object, the new text only)."""
    try:
        response = predictor.predict(PAYLOAD)
        if tgi:
            assert response == [{"generated_text": PROMPT + expected}]
            assert response[0]["generated_text"][len(PROMPT):] == expected  # TGI's idiom
        else:
            assert response == {"generated_text": expected}
        record = predictor.describe()
        pids = [i.pid for i in record.instances] + [record.supervisor["pid"]]
        assert all(_alive(pid) for pid in pids)
    finally:
        predictor.delete_endpoint()
    assert session.metadata.find_endpoint(predictor.endpoint_name) is None
    wait_until(lambda: not any(_alive(pid) for pid in pids), 30,
               what="the endpoint's server and supervisor gone")


def test_hugging_face_model_from_model_data(session, hf_model_dir, expected, tmp_path):
    # model_data as SageMaker code has it: the model.tar.gz a training job wrote.
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(hf_model_dir.iterdir()):
            tar.add(path, arcname=path.name)
    role = sagemaker.get_execution_role()
    huggingface_model = HuggingFaceModel(
        model_data=str(archive), role=role, transformers_version=transformers.__version__,
        pytorch_version="2.1", py_version="py310", env=ENV)
    predictor = huggingface_model.deploy(initial_instance_count=1,
                                         instance_type="ml.m5.xlarge",
                                         endpoint_name=f"hf-tar-{uuid.uuid4().hex[:8]}")
    assert isinstance(predictor, HuggingFacePredictor)
    _predict_then_delete(session, predictor, expected)


def test_hugging_face_model_from_hf_model_id(session, hf_model_dir, expected):
    # TGI's idiom: the model named by HF_MODEL_ID (here a local directory: no network).
    hub = {"HF_MODEL_ID": str(hf_model_dir), "MAX_TOTAL_TOKENS": "96"}
    llm_model = HuggingFaceModel(
        role=sagemaker.get_execution_role(), env={**hub, **ENV},
        image_uri=sagemaker.huggingface.get_huggingface_llm_image_uri("huggingface"))
    llm = llm_model.deploy(initial_instance_count=1, instance_type="ml.m5.xlarge",
                           endpoint_name=f"hf-id-{uuid.uuid4().hex[:8]}")
    # TGI's answer with details, and without the prompt, as notebooks ask for it
    chat = llm.predict({"inputs": PROMPT, "parameters": {
        "max_new_tokens": 4, "return_full_text": False, "details": True}})
    assert isinstance(chat, list) and chat[0]["generated_text"] == expected
    details = chat[0]["details"]
    assert details["generated_tokens"] == len(details["tokens"]) > 0
    assert details["finish_reason"] in ("length", "eos_token")  # TGI's names
    _predict_then_delete(session, llm, expected)


def test_hugging_face_model_with_the_lmi_image_answers_as_lmi(session, hf_model_dir,
                                                               expected):
    # get_huggingface_llm_image_uri("lmi") is DJL's container: LMI's object, not TGI's list.
    llm_model = HuggingFaceModel(
        role=sagemaker.get_execution_role(), env={"HF_MODEL_ID": str(hf_model_dir), **ENV},
        image_uri=sagemaker.huggingface.get_huggingface_llm_image_uri("lmi"))
    assert "OPTION_TGI_COMPAT" not in llm_model.env
    llm = llm_model.deploy(initial_instance_count=1, instance_type="ml.m5.xlarge",
                           endpoint_name=f"hf-lmi-{uuid.uuid4().hex[:8]}")
    _predict_then_delete(session, llm, expected, tgi=False)


def test_djl_model_from_model_id(session, hf_model_dir, expected):
    model = DJLModel(model_id=str(hf_model_dir), dtype="fp32", env=ENV,
                     role=sagemaker.get_execution_role())
    predictor = model.deploy(initial_instance_count=1, instance_type="ml.m5.xlarge",
                             endpoint_name=f"djl-{uuid.uuid4().hex[:8]}")
    assert isinstance(predictor, DJLPredictor)
    _predict_then_delete(session, predictor, expected, tgi=False)


_TRAIN = """
import argparse, os

from shoal.llm import create_tiny_model  # stands in for Trainer(...).train()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--model_dir", default=os.environ["SM_MODEL_DIR"])
    args, _ = parser.parse_known_args()
    texts = [f"{a} {b} {c}." for a in ("The shoal", "A reef", "Every job", "The server")
             for b in ("swims past", "answers", "batches", "streams")
             for c in ("the tokens", "a request", "quickly", "in order", "the ping")]
    create_tiny_model(args.model_dir, texts * 3, vocab_size=400, hidden_size=64,
                      num_layers=2, max_positions=128)
"""


def test_hugging_face_estimator_deploys_a_hugging_face_model(session, tmp_path):
    source = tmp_path / "scripts"
    source.mkdir()
    (source / "train.py").write_text(textwrap.dedent(_TRAIN))
    huggingface_estimator = HuggingFace(
        entry_point="train.py", source_dir=str(source), instance_type="ml.m5.xlarge",
        instance_count=1, role=sagemaker.get_execution_role(),
        transformers_version=transformers.__version__, hyperparameters={"epochs": 1})
    huggingface_estimator.fit(wait=True, logs=False)

    model = huggingface_estimator.create_model()
    assert isinstance(model, HuggingFaceModel)
    assert model.name == huggingface_estimator.latest_training_job.name
    assert model.entry_point is None  # the training script is not inference code
    assert model.transformers_version == huggingface_estimator.framework_version

    trained = tmp_path / "trained"
    with tarfile.open(_local(huggingface_estimator.model_data)) as tar:
        tar.extractall(trained, filter="data")
    predictor = huggingface_estimator.deploy(initial_instance_count=1,
                                             instance_type="ml.m5.xlarge", env=ENV)
    assert isinstance(predictor, HuggingFacePredictor)
    _predict_then_delete(session, predictor, Reference(trained).text(PROMPT, 4))


def _local(uri: str) -> str:
    assert uri.startswith("file://"), uri  # the session's artifact store is local here
    return uri.removeprefix("file://")
