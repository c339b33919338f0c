"""An LLM deployed like any model (issue #8): ``Model(model_data=DIR).deploy()`` on a directory
with ``serving.properties`` starts the LLM server, ``Predictor.predict`` speaks the LMI schema;
a bad value or a model that cannot be found fails the endpoint, saying which and where."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_models import Reference, make_tiny_llm  # noqa: E402
from shoal.errors import EndpointFailedError, InvocationError  # noqa: E402
from shoal.model import Model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llm(tmp_path_factory.mktemp("llm") / "model")


# Loading torch and transformers in a Ray Serve replica took over the suite's 120 s per test
# on a busy machine (two suites and two spinning processes on 2 cores): a deadline for a
# hung deploy, not a speed claim.
@pytest.mark.timeout(360)
def test_deploy_predict_and_delete_an_llm(endpoint_session, model_dir):
    """Part of the endpoint contract: also on Ray Serve (tests/integration/conftest.py)."""
    want = Reference(model_dir).text("A reef answers", 8)
    predictor = Model(model_data=str(model_dir), env={"OMP_NUM_THREADS": "1"}).deploy(
        endpoint_name=f"tiny-llm-{uuid.uuid4().hex[:8]}")
    try:
        answer = predictor.predict({"inputs": "A reef answers",
                                    "parameters": {"max_new_tokens": 8, "do_sample": False}})
        assert answer == {"generated_text": want}
        with pytest.raises(InvocationError) as info:
            predictor.predict({"inputs": "A reef", "parameters": {"max_new_tokens": -1}})
        assert info.value.details["status_code"] == 422
        assert "max_new_tokens must be >= 1" in str(info.value)
    finally:
        predictor.delete_endpoint()


def test_bad_properties_and_missing_models_fail_the_endpoint_clearly(session, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "serving.properties").write_text("engine=Python\noption.dtype=fp99\n")
    with pytest.raises(EndpointFailedError) as info:
        Model(model_data=str(bad)).deploy(endpoint_name="bad-dtype")
    assert "option.dtype='fp99'" in str(info.value)

    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "serving.properties").write_text("engine=Python\noption.model_id=acme/none\n")
    with pytest.raises(EndpointFailedError) as info:
        Model(model_data=str(missing)).deploy(endpoint_name="no-model")
    message = str(info.value)
    assert "option.model_id='acme/none' cannot be found" in message
    assert str(missing / "acme" / "none") in message and "Hugging Face cache" in message
