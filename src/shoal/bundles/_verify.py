"""``verify_bundle``: install a bundle into a fresh virtualenv, run it as its platform would,
and compare its answers with the source model's (kept in ``model/samples.npz`` at build).

The environment holds only the bundle's ``requirements.txt`` (uv, cached by what is installed,
like job environments: ``shoal envs list`` shows them). Azure and Lambda run in-process in
that environment through ``_harness.py``; the ASGI app and the container's server run under
uvicorn and are called over HTTP.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.extras import require
from shoal.bundles._build import BUNDLE_MODULES, MIN_AGREEMENT, check_size
from shoal.bundles._model import Parity, compare
from shoal.bundles._options import BundleTarget, parse_target
from shoal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shoal.envs import UvEnvBuilder
    from shoal.session import Session

__all__ = ["VerifyCheck", "VerifyReport", "verify_bundle"]

_HARNESS = Path(__file__).with_name("_harness.py")
_RTOL = 1e-4  # answers vs the model as built: the same onnxruntime, up to summation order


@dataclass(frozen=True, slots=True)
class VerifyCheck:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``verify_bundle`` found; ``ok`` when every check passed."""

    path: Path
    target: BundleTarget
    ok: bool
    checks: tuple[VerifyCheck, ...]
    weights: str
    parity: Parity          # the installed bundle's answers against the source model
    environment: Path
    env_cached: bool
    env_seconds: float
    run_seconds: float
    installed_bytes: int    # the bundle plus its installed requirements
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Request:
    name: str
    method: str
    body: bytes
    content_type: str = "application/json"
    query: dict[str, str] = field(default_factory=dict)
    base64: bool = False
    status: int = 200

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "content_type": self.content_type,
                "query": self.query, "base64": self.base64,
                "body": base64.b64encode(self.body).decode()}


def verify_bundle(path: str | os.PathLike[str], *, env_root: str | os.PathLike[str] | None = None,
                  session: Session | None = None, timeout: float = 180.0) -> VerifyReport:
    """Install *path*'s requirements into a fresh virtualenv, load it as its platform would,
    send sample requests and compare the answers with the source model.

    Args:
        path: a bundle directory or ``.zip`` made by ``build_bundle``.
        env_root: where the environments are cached (default: the session's, under
            ``SHOAL_HOME/envs``).
        timeout: seconds for the bundle to load and answer, after its environment is built.

    Example:
        >>> verify_bundle("mnist.zip").ok  # doctest: +SKIP
        True
    """
    require("bundle", "shoal bundle verify", *BUNDLE_MODULES)
    import numpy as np

    source = Path(path).expanduser().absolute()
    with tempfile.TemporaryDirectory(prefix="shoal-verify-") as tmp:
        bundle = _open(source, Path(tmp), session)
        manifest = _manifest(bundle, source)
        target = parse_target(manifest["target"])
        builder = _builder(env_root, session)
        env = builder.ensure((bundle / "requirements.txt").read_text(encoding="utf-8"),
                             base_dir=bundle)
        with np.load(bundle / "model" / "samples.npz", allow_pickle=False) as npz:
            samples = {k: npz[k] for k in npz.files}
        requests = _requests(manifest, samples, target)
        started = time.monotonic()
        answers, checks = _exercise(target, bundle, env.python, requests, timeout,
                                    Path(tmp), manifest)
        more, parity = _judge(manifest, samples, requests, answers)
        checks += more
        run_seconds = time.monotonic() - started
        installed = _tree_bytes(env.path) + _tree_bytes(bundle)
    notes = check_size(target, zipped_bytes=None, unzipped_bytes=installed,
                       what="the bundle with its requirements installed")
    return VerifyReport(source, target, all(c.ok for c in checks), tuple(checks),
                        manifest["weights"], parity, env.path, env.cached, env.seconds,
                        run_seconds, installed, tuple(notes))


def _builder(env_root: str | os.PathLike[str] | None, session: Session | None
             ) -> UvEnvBuilder:
    from shoal.envs import UvEnvBuilder

    if env_root is not None:
        return UvEnvBuilder(Path(env_root))
    if session is None:
        from shoal.session import current

        session = current()
    builder: UvEnvBuilder = session.env_builder
    return builder


def _open(source: Path, tmp: Path, session: Session | None) -> Path:
    if source.is_dir():
        return source
    if not source.is_file():
        raise InvalidArgumentError(f"no bundle at {source}", path=str(source))
    from shoal._internal.archives import ExtractLimits, extract_zip

    if not zipfile.is_zipfile(source):
        raise InvalidArgumentError(f"{source} is not a bundle .zip (nor a bundle directory)",
                                   path=str(source))
    # Caps on size and file count (the session's, else SHOAL_MAX_EXTRACT_*), checked while
    # extracting; entries outside the directory are refused; nothing left behind on failure.
    limits = ExtractLimits.from_settings(session.settings) if session is not None else None
    extract_zip(source, tmp / "bundle", limits=limits, label=f"the bundle {source}")
    return tmp / "bundle"


def _manifest(bundle: Path, source: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((bundle / "model" / "bundle.json").read_text())
        (bundle / "requirements.txt").stat()
        (bundle / "model" / "samples.npz").stat()
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{source} is not a shoal bundle (no readable "
                                   f"model/bundle.json, samples or requirements.txt): {e}",
                                   path=str(source)) from e
    return manifest


def _requests(manifest: dict[str, Any], samples: dict[str, Any],
              target: BundleTarget) -> list[_Request]:
    import numpy as np

    inputs = {k.split(":", 1)[1]: v for k, v in samples.items() if k.startswith("input:")}
    single = len(inputs) == 1
    every = next(iter(inputs.values())).tolist() if single else {
        k: v.tolist() for k, v in inputs.items()}
    one = next(iter(inputs.values()))[0].tolist() if single else {
        k: v[:1].tolist() for k, v in inputs.items()}
    lam = target == BundleTarget.AWS_LAMBDA
    out = [
        _Request("batch", "POST", json.dumps({"data": every, "raw": True}).encode(), base64=lam),
        _Request("one sample, raw outputs by query", "POST",
                 json.dumps({"data": one}).encode(), query={"raw": "1"}),
        _Request("malformed JSON", "POST", b'{"data": [1, 2', status=400),
        _Request("describe" if target in (BundleTarget.AZURE_FUNCTIONS, BundleTarget.AWS_LAMBDA)
                 else "ping", "GET", b""),
    ]
    spec = manifest["inputs"][0]
    sample_dims = (spec["shape"] or [None])[1:]
    if single and sample_dims and all(isinstance(d, int) for d in sample_dims):
        size = int(np.prod(sample_dims))
        if size > 1:
            out.append(_Request("wrong number of values", "POST",
                                json.dumps({"data": [0.5] * (size + 1)}).encode(), status=400))
        if spec["dtype"] != "string":
            buffer = io.BytesIO()
            np.save(buffer, next(iter(inputs.values()))[:4], allow_pickle=False)
            out.append(_Request("npy batch", "POST", buffer.getvalue(),
                                content_type="application/x-npy", base64=True))
    return out


def _exercise(target: BundleTarget, bundle: Path, python: Path, requests: list[_Request],
              timeout: float, tmp: Path,
              manifest: dict[str, Any]) -> tuple[list[dict[str, Any]], list[VerifyCheck]]:
    """The answers to *requests* (None where none came) and the checks on the way there."""
    if target in (BundleTarget.AZURE_FUNCTIONS, BundleTarget.AWS_LAMBDA):
        return _in_process(target, bundle, python, requests, timeout, tmp, manifest)
    return _over_http(target, bundle, python, requests, timeout, tmp)


def _in_process(target: BundleTarget, bundle: Path, python: Path, requests: list[_Request],
                timeout: float, tmp: Path,
                manifest: dict[str, Any]) -> tuple[list[dict[str, Any]], list[VerifyCheck]]:
    answers_file = tmp / "answers.json"
    payload = json.dumps({"requests": [r.to_json() for r in requests]})
    how = ("azure.functions.HttpRequest against function_app.app's function"
           if target == BundleTarget.AZURE_FUNCTIONS else "payload-2.0 events to lambda_handler")
    try:
        done = subprocess.run([str(python), "-I", str(_HARNESS), str(bundle), target.value,
                               str(answers_file)], input=payload, text=True, cwd=bundle,
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [], [VerifyCheck("loads", False, f"no answers within {timeout:.0f}s ({how})")]
    if done.returncode != 0:
        return [], [VerifyCheck("loads", False, f"the bundle failed under {how}:\n"
                                f"{(done.stderr or done.stdout).strip()[-3000:]}")]
    result = json.loads(answers_file.read_text(encoding="utf-8"))
    checks = [VerifyCheck("loads", True, f"{_render_entry(target)} imported in a fresh "
                          f"virtualenv; requests sent as {how}"),
              _no_shoal(not result["shoal_importable"])]
    function = result.get("function")
    if function is not None:
        want = (manifest["route"], manifest["auth_level"])
        got = (function["route"], function["auth_level"])
        checks.append(VerifyCheck("azure function binding", want == got and "POST" in
                                  function["methods"],
                                  f"{function['name']}: route {got[0]!r}, auth level {got[1]}, "
                                  f"methods {function['methods']}"))
    return result["answers"], checks


def _render_entry(target: BundleTarget) -> str:
    from shoal.bundles._render import ENTRY_FILES

    return ENTRY_FILES[target]


def _no_shoal(absent: bool) -> VerifyCheck:
    return VerifyCheck("no shoal", absent, "shoal is not importable in the bundle's environment"
                       if absent else "shoal is importable in the bundle's environment")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _over_http(target: BundleTarget, bundle: Path, python: Path, requests: list[_Request],
               timeout: float, tmp: Path) -> tuple[list[dict[str, Any]], list[VerifyCheck]]:
    import httpx

    port = _free_port()
    if target == BundleTarget.ASGI:
        command = [str(python), "-I", "-m", "uvicorn", "app:app", "--app-dir", str(bundle),
                   "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        how, path = "uvicorn app:app", "/" + _route(bundle)
    else:
        command = [str(python), "-I", str(bundle / "serve.py"), "serve", "--host", "127.0.0.1",
                   "--port", str(port)]
        how, path = "python serve.py serve (the image's ENTRYPOINT)", "/invocations"
    shoal_check = subprocess.run(
        [str(python), "-I", "-c", "import importlib.util, sys; "
         "sys.exit(importlib.util.find_spec('shoal') is not None)"], check=False, timeout=60)
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, cwd=bundle, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=timeout) as client:
            up = _wait_ready(client, server, timeout)
            if up is not None:
                return [], [VerifyCheck("loads", False, f"{how} {up}:\n"
                                        f"{log_path.read_text(errors='replace')[-3000:]}")]
            answers = []
            for r in requests:
                url = "/ping" if r.method == "GET" else path
                response = client.request(r.method, url, content=r.body or None,
                                          params=r.query,
                                          headers={"content-type": r.content_type})
                answers.append({"status": response.status_code, "body": response.text})
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    return answers, [VerifyCheck("loads", True, f"{how} answered /ping in a fresh virtualenv; "
                                 f"requests sent over HTTP to {path}"),
                     _no_shoal(shoal_check.returncode == 0)]


def _route(bundle: Path) -> str:
    return str(json.loads((bundle / "model" / "bundle.json").read_text())["route"])


def _wait_ready(client: Any, server: subprocess.Popen[bytes], timeout: float) -> str | None:
    """None once ``/ping`` answers 200; otherwise what went wrong."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"exited with status {server.returncode}"
        try:
            if client.get("/ping", timeout=2).status_code == 200:
                return None
        except httpx.TransportError:
            pass
        time.sleep(0.1)  # polling a starting server: there is nothing to wait on instead
    return f"did not answer /ping within {timeout:.0f}s"


def _judge(manifest: dict[str, Any], samples: dict[str, Any], requests: list[_Request],
           answers: list[dict[str, Any]]) -> tuple[list[VerifyCheck], Parity]:
    """Checks on each answer, and the parity of the batch answer with the source model."""
    import numpy as np

    key, mapped = manifest["output_key"], manifest["mapped_output"]
    argmax = manifest["output_map"] == "argmax"
    built = {k.split(":", 1)[1]: v for k, v in samples.items() if k.startswith("bundle:")}
    source = {k.split(":", 1)[1]: v for k, v in samples.items() if k.startswith("source:")}
    expected = built[mapped].argmax(axis=-1) if argmax else built[mapped]
    checks, parity = [], Parity(0, None, None)
    for request, answer in zip(requests, answers, strict=False):
        try:
            body = json.loads(answer["body"])
        except ValueError:
            checks.append(VerifyCheck(request.name, False, f"status {answer['status']}, the "
                                      f"answer is not JSON: {answer['body'][:200]!r}"))
            continue
        if answer["status"] != request.status:
            checks.append(VerifyCheck(request.name, False, f"status {answer['status']} (wanted "
                                      f"{request.status}): {answer['body'][:300]}"))
            continue
        if request.status >= 400:
            checks.append(VerifyCheck(request.name, "error" in body,
                                      f"{answer['status']}: {body.get('error', body)}"))
        elif request.name == "batch":
            check, parity = _batch(body, key, built, source, expected, manifest)
            checks.append(check)
        elif request.method == "POST":
            n = 1 if request.name.startswith("one") else 4
            got = np.asarray(body.get(key))
            ok = got.shape == expected[:n].shape and bool(np.all(got == expected[:n]))
            if request.query.get("raw"):
                ok = ok and "outputs" in body
            checks.append(VerifyCheck(request.name, ok, f"{key} {body.get(key)!r}; from the "
                                      f"model as built {expected[:n].tolist()!r}"))
        else:
            checks.append(VerifyCheck(request.name, True, f"{answer['status']}"))
    return checks, parity


def _batch(body: dict[str, Any], key: str, built: dict[str, Any], source: dict[str, Any],
           expected: Any, manifest: dict[str, Any]) -> tuple[VerifyCheck, Parity]:
    import numpy as np

    outputs = {k: np.asarray(v) for k, v in (body.get("outputs") or {}).items()}
    argmax = manifest["output_map"] == "argmax"
    mapped = manifest["mapped_output"]
    same = compare(built, outputs, mapped=mapped, argmax=argmax)
    answer = np.asarray(body.get(key))
    parity = compare(source, outputs, mapped=mapped, argmax=argmax)
    scale = max((float(np.max(np.abs(v), initial=0)) for v in built.values()
                 if np.asarray(v).dtype.kind == "f"), default=1.0)
    as_built = (same.close(rtol=_RTOL, atol=_RTOL, scale=scale)
                and answer.shape == expected.shape and bool(np.all(answer == expected)))
    exact_source = manifest["weights"] == "float32" and manifest["source"]["type"] == "onnx"
    matches_source = ((parity.agreement is None or parity.agreement >= MIN_AGREEMENT)
                      and (not exact_source or parity.close(rtol=_RTOL, atol=_RTOL,
                                                            scale=scale)))
    detail = (f"{same.samples} samples: answers {'equal' if as_built else 'DIFFER from'} the "
              f"model as built (max |Δ| {same.max_abs_diff or 0:.2g}); against the source "
              f"model ({manifest['weights']} weights): "
              + (f"{parity.agreement:.1%} of the predictions agree, "
                 if parity.agreement is not None else "")
              + f"max |Δ| {parity.max_abs_diff or 0:.2g}")
    return VerifyCheck("batch", as_built and matches_source, detail), parity


def _tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
