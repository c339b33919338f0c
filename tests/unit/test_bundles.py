"""Deployment bundles: what a build writes, the errors it gives, and the generated entry modules
run in this process (the fresh-virtualenv runs are in tests/integration/test_bundle_verify.py)."""

from __future__ import annotations

import ast
import asyncio
import base64
import importlib.util
import io
import json
import re
import tarfile
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bundle_models import make_mnist_cnn, once, session_shared, tiny_classifier
from shoal.bundles import (
    SIZE_LIMITS,
    BundleTarget,
    BundleWarning,
    build_bundle,
)
from shoal.bundles._build import check_size
from shoal.errors import AlreadyExistsError, InvalidArgumentError, ModelNotFound

TARGETS = [t.value for t in BundleTarget]
ENTRY = {"azure-functions": "function_app.py", "aws-lambda": "lambda_function.py",
         "container": "serve.py", "asgi": "app.py"}


@pytest.fixture(scope="session")
def mnist(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return once(session_shared(tmp_path_factory, worker_id), "mnist-cnn", make_mnist_cnn)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return tiny_classifier(tmp_path / "tiny" / "model.onnx").parent


def _load(path: Path) -> Any:
    """Import a generated entry module from its bundle, under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"bundle_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- options and bad input ----------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"colour": "red"}, "unknown bundle option"),
    ({"route": "a b"}, "not a plain URL path"),
    ({"route": "../etc"}, "not a plain URL path"),
    ({"output_map": "softmax"}, "not one of ['argmax', 'identity']"),
    ({"auth_level": "function"}, "applies to azure-functions bundles only"),
    ({"output_key": "two words"}, "not a plain name"),
])
def test_bad_options_are_refused_before_any_work(tiny, tmp_path, options, message):
    with pytest.raises(InvalidArgumentError) as e:
        build_bundle(tiny, target="asgi", output=tmp_path / "out", **options)
    assert message in str(e.value)
    assert not (tmp_path / "out").exists()


def test_unknown_target_lists_the_targets(tiny, tmp_path):
    with pytest.raises(InvalidArgumentError, match="azure-functions.*aws-lambda.*container"):
        build_bundle(tiny, target="gcp", output=tmp_path / "out")


@pytest.mark.parametrize("target", ["aws-lambda", "azure-functions"])
def test_an_unsupported_model_type_names_the_supported_ones(tmp_path, target):
    model = tmp_path / "torch-model"
    model.mkdir()
    (model / "model.pth").write_bytes(b"not really a state dict")
    with pytest.raises(InvalidArgumentError) as e:
        build_bundle(model, target=target, output=tmp_path / "out")
    text = str(e.value)
    assert f"holds a pytorch model (model.pth); {target} bundles take: onnx" in text
    assert "scikit-learn (model.joblib or model.pkl" in text and "torch.onnx.export" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgumentError, match="holds no model file; .* take: onnx"):
        build_bundle(empty, target=target, output=tmp_path / "out")


def test_a_model_that_is_nowhere_is_not_found(tmp_path):
    with pytest.raises(ModelNotFound, match="not a directory, a file, a model.tar.gz URI"):
        build_bundle(str(tmp_path / "missing" / "model.onnx"), target="asgi",
                     output=tmp_path / "out")


def test_an_existing_output_is_replaced_only_with_force(tiny, tmp_path):
    out = tmp_path / "bundle.zip"
    out.write_bytes(b"something else")
    with pytest.raises(AlreadyExistsError, match=r"bundle.zip exists; pass --force"):
        build_bundle(tiny, target="aws-lambda", output=out)
    assert out.read_bytes() == b"something else"
    build_bundle(tiny, target="aws-lambda", output=out, force=True)
    assert "lambda_function.py" in zipfile.ZipFile(out).namelist()

    directory = tmp_path / "dir"
    build_bundle(tiny, target="asgi", output=directory)
    with pytest.raises(AlreadyExistsError):
        build_bundle(tiny, target="asgi", output=directory)
    record = build_bundle(tiny, target="container", output=directory, force=True)
    assert (directory / "Dockerfile").exists() and not (directory / "app.py").exists()
    assert record.path == directory

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(InvalidArgumentError, match="not a shoal bundle; refusing to replace"):
        build_bundle(tiny, target="asgi", output=precious, force=True)
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_a_bundle_over_lambdas_documented_limit_warns_with_the_number(tmp_path):
    # 13.5 M float32 values of random bits: 54 MB that deflate cannot shrink below 50 MB.
    table = np.frombuffer(np.random.default_rng(0).bytes(54_000_000), np.float32)
    table = table.reshape(-1, 4)
    model = tiny_classifier(tmp_path / "big" / "model.onnx", extra=table)
    with pytest.warns(BundleWarning) as caught:
        record = build_bundle(model.parent, target="aws-lambda", output=tmp_path / "big.zip")
    [message] = [str(w.message) for w in caught]
    assert re.search(r"the bundle is 5\d\.\d MB zipped, over the 50 MB limit", message)
    assert "250 MB unzipped" in message and "gettingstarted-limits" in message
    assert record.warnings == (message,) and record.zipped_bytes > 50_000_000
    assert record.weights == "float32"  # an unused table is no Conv/Gemm/MatMul weight


def test_size_limits_are_the_documented_ones():
    lam = SIZE_LIMITS[BundleTarget.AWS_LAMBDA]
    assert (lam.zipped_bytes, lam.unzipped_bytes) == (50_000_000, 250_000_000)
    azure = SIZE_LIMITS[BundleTarget.AZURE_FUNCTIONS]
    assert azure.unzipped_bytes == 1_000_000_000 and "functions-scale" in azure.source
    [note] = check_size(BundleTarget.AZURE_FUNCTIONS, zipped_bytes=None,
                        unzipped_bytes=1_234_000_000, what="the bundle with its requirements")
    assert "1234.0 MB unzipped, over the 1000 MB limit" in note and "Consumption plan" in note
    assert check_size(BundleTarget.ASGI, zipped_bytes=10**10, unzipped_bytes=10**10,
                      what="x") == []


# --- what a build writes ------------------------------------------------------------------

def test_the_mnist_cnn_bundle_is_at_most_2_mb_with_int8_weights(mnist, tmp_path):
    samples = mnist / "samples.npy"
    record = build_bundle(mnist, target="azure-functions", output=tmp_path / "mnist.zip",
                          samples=samples)
    assert record.zipped_bytes <= 2_000_000, record.zipped_bytes
    assert record.weights == "int8" and record.warnings == ()
    assert record.parity.samples == 64 and record.parity.agreement >= 0.98
    full = build_bundle(mnist, target="azure-functions", output=tmp_path / "full.zip",
                        samples=samples, quantize=False)
    assert full.weights == "float32" and full.zipped_bytes > 4_000_000
    assert full.parity.agreement == 1.0 and full.parity.max_abs_diff == 0.0
    with zipfile.ZipFile(record.path) as zf:
        names = set(zf.namelist())
        manifest = json.loads(zf.read("model/bundle.json"))
    assert {"function_app.py", "host.json", "requirements.txt", "README.md", "sample.json",
            "model/model.onnx", "model/bundle.json", "model/samples.npz"} <= names
    assert manifest["output_map"] == "argmax" and manifest["output_key"] == "digits"
    assert manifest["weights"] == "int8" and manifest["parity"]["inputs"] == "given"


@pytest.mark.parametrize("target", TARGETS)
def test_entry_modules_are_one_file_that_never_imports_shoal(tiny, tmp_path, target):
    record = build_bundle(tiny, target=target, output=tmp_path / target, route="score/v1")
    entry = (record.path / ENTRY[target]).read_text()
    imported = set()
    for node in ast.walk(ast.parse(entry)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    allowed_third_party = {"numpy", "onnxruntime", "azure", "uvicorn"}
    assert not {m for m in imported if m not in allowed_third_party
                and m not in __import__("sys").stdlib_module_names}, imported
    assert "shoal" not in imported and "runtime" not in imported
    py_files = [f for f in record.files if f.endswith(".py")]
    assert py_files == [ENTRY[target]]
    if target != "aws-lambda":
        assert 'ROUTE = "score/v1"' in entry
    if target == "azure-functions":
        assert "AUTH_LEVEL = func.AuthLevel.FUNCTION" in entry
        host = json.loads((record.path / "host.json").read_text())
        assert host["version"] == "2.0" and "extensionBundle" in host


def test_requirements_are_pinned_to_what_the_model_needs(tiny, tmp_path):
    from importlib.metadata import version

    pins = [f"numpy=={version('numpy')}", f"onnxruntime=={version('onnxruntime')}"]
    for target, extra in (
            ("aws-lambda", []),
            ("azure-functions", ['azure-functions>=1.20,<2; python_version < "3.13"',
                                 'azure-functions>=2,<3; python_version >= "3.13"']),
            ("asgi", ["uvicorn>=0.30,<1"]), ("container", ["uvicorn>=0.30,<1"])):
        record = build_bundle(tiny, target=target, output=tmp_path / target)
        lines = [ln for ln in (record.path / "requirements.txt").read_text().splitlines()
                 if ln and not ln.startswith("#")]
        assert lines == pins + extra, target


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    return [(line.split()[0].upper(), line.split(None, 1)[1].strip())
            for line in (ln.strip() for ln in joined.splitlines())
            if line and not line.startswith("#")]


def test_the_dockerfile_is_a_slim_non_root_sagemaker_container(tiny, tmp_path):
    import sys

    record = build_bundle(tiny, target="container", output=tmp_path / "c")
    steps = _instructions((record.path / "Dockerfile").read_text())
    kinds = [k for k, _ in steps]
    args = {k: [a for kk, a in steps if kk == k] for k in kinds}
    assert args["FROM"] == [f"python:{sys.version_info.major}.{sys.version_info.minor}-slim"]
    [user] = args["USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    assert "useradd" in " ".join(args["RUN"]) and "10001" in " ".join(args["RUN"])
    assert args["EXPOSE"] == ["8080"]
    [health] = args["HEALTHCHECK"]
    assert health.startswith("--interval=") and "CMD" in health
    assert "http://127.0.0.1:8080/ping" in health
    # inside a container it listens on every interface; run by hand, on 127.0.0.1
    assert args["ENTRYPOINT"] == ['["python", "/opt/program/serve.py", "--host", "0.0.0.0"]']
    assert args["CMD"] == ['["serve"]']  # SageMaker starts it as 'docker run IMAGE serve'
    assert "model/ ./model/" in args["COPY"]
    assert "README.md" in (record.path / ".dockerignore").read_text()


@pytest.mark.parametrize("target, commands", [
    ("azure-functions", ["func start", "az functionapp create", "func azure functionapp publish",
                         "--function-name predict", "curl -s -X POST"]),
    ("aws-lambda", ["--platform manylinux2014_x86_64", "aws lambda create-function",
                    "--handler lambda_function.lambda_handler",
                    "aws lambda create-function-url-config", "curl -s -X POST"]),
    ("container", ["docker build -t", "docker run --rm -p 8080:8080", "/invocations",
                   "docker push"]),
    ("asgi", ["uvicorn app:app", "curl -s -X POST http://localhost:8080/classify"]),
])
def test_the_readme_has_the_platforms_deploy_and_test_commands(tiny, tmp_path, target, commands):
    record = build_bundle(tiny, target=target, output=tmp_path / target)
    readme = (record.path / "README.md").read_text()
    for command in commands:
        assert command in readme, command
    assert "$" not in readme.replace("$KEY", "").replace("$(az", "").replace(
        "$FUNCTION_URL", "")  # every placeholder filled
    sample = json.loads((record.path / "sample.json").read_text())
    assert len(sample["data"]) == 4


# --- the generated code, run here ---------------------------------------------------------

def _event(body: bytes | str, *, method: str = "POST", content_type: str = "application/json",
           b64: bool = False, query: dict[str, str] | None = None) -> dict[str, Any]:
    raw = body.encode() if isinstance(body, str) else body
    return {"version": "2.0", "rawPath": "/", "headers": {"Content-Type": content_type},
            "queryStringParameters": query,
            "requestContext": {"http": {"method": method, "path": "/"}},
            "body": base64.b64encode(raw).decode() if b64 else raw.decode("latin-1"),
            "isBase64Encoded": b64}


def test_the_lambda_handler_answers_and_refuses_malformed_requests(tiny, tmp_path):
    import onnxruntime as ort

    record = build_bundle(tiny, target="aws-lambda", output=tmp_path / "lambda")
    handler = _load(record.path / "lambda_function.py").lambda_handler
    x = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
    want = ort.InferenceSession(str(tiny / "model.onnx")).run(None, {"x": x})[0]

    def call(event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        response = handler(event, None)
        assert response["headers"]["content-type"] == "application/json"
        return response["statusCode"], json.loads(response["body"])

    status, body = call(_event(json.dumps({"data": x.tolist(), "raw": True}), b64=True))
    assert status == 200 and body["digits"] == want.argmax(1).tolist()
    np.testing.assert_allclose(body["outputs"]["logits"], want, rtol=1e-5)
    status, body = call(_event(json.dumps({"data": x[0].tolist()}), query={"raw": "1"}))
    assert status == 200 and body["digits"] == [int(want[0].argmax())] and "outputs" in body
    npy = io.BytesIO()
    np.save(npy, x)
    status, body = call(_event(npy.getvalue(), content_type="application/x-npy", b64=True))
    assert status == 200 and body["digits"] == want.argmax(1).tolist()
    csv = "\n".join(",".join(str(float(v)) for v in row) for row in x)
    assert call(_event(csv, content_type="text/csv"))[1]["digits"] == want.argmax(1).tolist()
    assert call(_event("", method="GET"))[1]["inputs"][0]["name"] == "x"

    for event, status, message in [
        (_event('{"data": [1, 2'), 400, "not valid JSON"),
        (_event('{"rows": [[1, 2, 3, 4]]}'), 400, 'send a JSON object {"data"'),
        (_event('{"data": [1, 2, 3]}'), 400, "takes samples of shape [4]"),
        (_event('{"data": [[1, null, 3, 4]]}'), 400, "must be a (nested) list of numbers"),
        (_event('{"data": [[1, 2], [3]]}'), 400, "must be a (nested) list of numbers"),
        (_event('{"data": "abcd"}'), 400, "must be a (nested) list of numbers"),
        (_event(b"\xff\xfe", content_type="application/json"), 400, "not valid JSON"),
        ({**_event(""), "body": "not base64!", "isBase64Encoded": True}, 400, "not base64"),
        (_event(b"\x93NUMPY garbage", content_type="application/x-npy", b64=True), 400,
         "not a .npy array"),
        (_event("<x/>", content_type="application/xml"), 415, "not supported"),
        (_event("", method="DELETE"), 405, "use POST"),
    ]:
        got_status, body = call(event)
        assert (got_status, message in body["error"]) == (status, True), (event, body)


def _asgi(app: Any, method: str, path: str, body: bytes = b"", query: bytes = b"",
          content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, bytes]:
        incoming = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop(0) if incoming else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "query_string": query,
                 "headers": [(b"content-type", content_type.encode())]}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    status, raw = asyncio.run(run())
    return status, json.loads(raw)


@pytest.mark.parametrize("target", ["asgi", "container"])
def test_the_asgi_app_speaks_the_sagemaker_contract(tiny, tmp_path, target):
    record = build_bundle(tiny, target=target, output=tmp_path / target, output_key="label")
    app = _load(record.path / ENTRY[target]).app
    x = [[0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 0.5, 2.0]]
    assert _asgi(app, "GET", "/ping") == (200, {"status": "ok"})
    status, body = _asgi(app, "POST", "/invocations", json.dumps({"data": x}).encode())
    assert status == 200 and len(body["label"]) == 2 and "outputs" not in body
    assert _asgi(app, "POST", "/classify", json.dumps({"data": x}).encode(),
                 query=b"raw=true")[1].keys() == {"label", "outputs"}
    status, body = _asgi(app, "POST", "/invocations", b'{"data": [1, 2')
    assert status == 400 and "not valid JSON" in body["error"]
    assert _asgi(app, "GET", "/invocations")[0] == 405
    assert _asgi(app, "GET", "/elsewhere")[0] == 404


# --- other sources ------------------------------------------------------------------------

def test_a_scikit_learn_model_is_converted_and_answers_its_labels(tmp_path):
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, names)
    (tmp_path / "iris").mkdir()
    joblib.dump(model, tmp_path / "iris" / "model.joblib")
    record = build_bundle(tmp_path / "iris", target="aws-lambda", output=tmp_path / "out",
                          samples=_save(tmp_path / "x.npy", x.astype(np.float32)))
    assert record.model_type == "scikit-learn" and record.weights == "float32"
    assert record.parity.agreement >= 0.99  # skl2onnx's float32 against sklearn's float64
    manifest = json.loads((record.path / "model" / "bundle.json").read_text())
    assert (manifest["output_map"], manifest["output_key"]) == ("identity", "predictions")
    handler = _load(record.path / "lambda_function.py").lambda_handler
    answer = handler(_event(json.dumps({"data": x[::30].tolist()})), None)
    assert json.loads(answer["body"])["predictions"] == model.predict(x[::30]).tolist()


def _save(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def test_model_tar_gz_paths_and_uris_are_unpacked(tiny, tmp_path):
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tiny / "model.onnx", arcname="model.onnx")
        tar.add(tiny / "model.onnx", arcname="code/unused.txt")
    for source in (archive, f"file://{archive}"):
        record = build_bundle(source, target="asgi", output=tmp_path / f"o{uuid.uuid4().hex}")
        assert record.source == str(source) and record.model_type == "onnx"
        assert (record.path / "model" / "model.onnx").read_bytes() == (
            tiny / "model.onnx").read_bytes()


def test_model_bundle_delegates_to_the_builder(tiny, tmp_path):
    from shoal.model import Model

    record = Model(model_data=str(tiny)).bundle(target="aws-lambda", path=tmp_path / "m.zip",
                                     output_key="scores")
    assert record.path == tmp_path / "m.zip" and record.target == "aws-lambda"
    with zipfile.ZipFile(record.path) as zf:
        assert json.loads(zf.read("model/bundle.json"))["output_key"] == "scores"
    (tmp_path / "inference.py").write_text("def model_fn(d): ...\n")
    with pytest.raises(InvalidArgumentError, match="inference code .* would be lost"):
        Model(model_data=str(tiny), entry_point=str(tmp_path / "inference.py")).bundle(
            target="asgi", path=tmp_path / "x")


def test_a_model_with_a_fixed_batch_of_one_answers_batches(tmp_path):
    import onnx

    path = tiny_classifier(tmp_path / "fixed" / "model.onnx")
    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 1  # exported without dynamic axes
    onnx.save(model, str(path))
    record = build_bundle(path.parent, target="aws-lambda", output=tmp_path / "out")
    assert record.parity.samples == 256 and record.parity.max_abs_diff == 0.0
    handler = _load(record.path / "lambda_function.py").lambda_handler
    answer = handler(_event(json.dumps({"data": np.ones((3, 4)).tolist()})), None)
    assert answer["statusCode"] == 200 and len(json.loads(answer["body"])["digits"]) == 3
