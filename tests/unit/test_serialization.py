"""serialization: signed, versioned cloudpickle envelopes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from shoal.errors import (
    PayloadIntegrityError,
    PayloadVersionError,
    PicklingError,
    SerializationError,
)
from shoal.serialization import (
    FORMAT_VERSION,
    Payload,
    deserialize,
    new_key,
    python_version,
    serialize,
)

KEY = new_key()
GOLDEN = Path(__file__).parents[1] / "data" / "payloads" / "v1"
#: The fixed key tests/data/payloads/make_v1.py signed the golden payload with.
GOLDEN_KEY = "00112233445566778899aabbccddeeff" * 2
GOLDEN_OBJECT = {
    "name": "golden",
    "numbers": [1, 2.5, -3, 10**20],
    "nested": {"tuple": (1, "two", None), "flags": [True, False]},
    "bytes": b"\x00\x01\xff",
    "text": "h\u00e9llo \u2603",
}


def _with_meta(payload: Payload, **changes: object) -> Payload:
    meta = payload.meta
    meta.update(changes)
    return Payload(payload.data, json.dumps(meta).encode())


class _Trap:
    """Unpickling this creates *marker*: proof that the bytes were unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.mkdir, (str(self.marker),))


def test_closure_round_trip() -> None:
    factor = 7
    offsets = {"a": 1}

    def scale(x: int) -> int:
        return x * factor + offsets["a"]

    payload = serialize(scale, KEY, what="function 'scale'")
    back = deserialize(payload, KEY, what="function 'scale'")
    assert back(3) == 22


def test_arguments_round_trip() -> None:
    args = ((1, "two", [3.0]), {"k": {"nested": (None, True)}})
    assert deserialize(serialize(args, KEY, what="arguments"), KEY, what="arguments") == args


def test_metadata_describes_the_payload() -> None:
    payload = serialize([1, 2, 3], KEY, what="x")
    meta = payload.meta
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["serializer"] == "cloudpickle"
    assert meta["python_version"] == python_version()
    assert meta["size"] == len(payload.data)
    assert len(meta["hmac_sha256"]) == 64


def test_the_trap_works_when_untampered(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    deserialize(serialize(_Trap(marker), KEY, what="trap"), KEY, what="trap")
    assert marker.exists()


@pytest.mark.parametrize("where", [0, "middle", -1])
def test_tampered_payload_is_not_unpickled(tmp_path: Path, where: object) -> None:
    marker = tmp_path / "unpickled"
    payload = serialize(_Trap(marker), KEY, what="function 'f'")
    data = bytearray(payload.data)
    i = len(data) // 2 if where == "middle" else int(where)  # type: ignore[call-overload]
    data[i] ^= 0x01
    with pytest.raises(PayloadIntegrityError, match="HMAC") as info:
        deserialize(Payload(bytes(data), payload.metadata), KEY, what="function 'f'")
    assert "function 'f'" in str(info.value)
    assert not marker.exists()


def test_appended_bytes_are_rejected(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = serialize(_Trap(marker), KEY, what="f")
    with pytest.raises(PayloadIntegrityError):
        deserialize(Payload(payload.data + b".", payload.metadata), KEY, what="f")
    assert not marker.exists()


def test_wrong_key_is_an_integrity_error(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = serialize(_Trap(marker), KEY, what="f")
    with pytest.raises(PayloadIntegrityError):
        deserialize(payload, new_key(), what="f")
    assert not marker.exists()


def test_forged_hmac_field_is_rejected(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = serialize(_Trap(marker), KEY, what="f")
    for forged in ("", "0" * 64, None, 123):
        with pytest.raises(PayloadIntegrityError):
            deserialize(_with_meta(payload, hmac_sha256=forged), KEY, what="f")
    assert not marker.exists()


@pytest.mark.parametrize("metadata", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_metadata_that_is_not_json_is_unreadable_not_tampered_with(tmp_path: Path,
                                                                   metadata: bytes) -> None:
    payload = serialize(1, KEY, what="f")
    with pytest.raises(SerializationError, match="metadata.json.*unreadable") as info:
        deserialize(Payload(payload.data, metadata), KEY, what="f")
    assert not isinstance(info.value, PayloadIntegrityError)  # the HMAC decides tampering
    assert info.value.details["unreadable"] is True


def test_envelopes_do_not_use_what_user_code_did_to_json(monkeypatch) -> None:
    import json

    class Hostile(json.JSONEncoder):
        def encode(self, o):
            return "not json {"

    monkeypatch.setattr(json, "JSONEncoder", Hostile)
    monkeypatch.setattr(json.encoder.JSONEncoder, "encode", lambda self, o: "garbage")
    monkeypatch.setattr(json.encoder.JSONEncoder, "iterencode", lambda self, o, *a: iter(["x"]))
    monkeypatch.setattr(json, "dumps", lambda *a, **k: "garbage")
    monkeypatch.setattr(json, "loads", lambda *a, **k: {"format_version": 99})
    monkeypatch.setattr(json.decoder.JSONDecoder, "decode", lambda self, s: [])
    payload = serialize({"answer": 42}, KEY, what="f")
    assert deserialize(payload, KEY, what="f") == {"answer": 42}
    assert payload.meta["format_version"] == 1


def test_python_version_mismatch(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = _with_meta(serialize(_Trap(marker), KEY, what="f"), python_version="2.7")
    with pytest.raises(PayloadVersionError) as info:
        deserialize(payload, KEY, what="f")
    assert "2.7" in str(info.value) and python_version() in str(info.value)
    assert info.value.details["client_python"] == "2.7"
    assert not marker.exists()


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, None, "1"])
def test_format_version_mismatch(tmp_path: Path, version: object) -> None:
    marker = tmp_path / "unpickled"
    payload = _with_meta(serialize(_Trap(marker), KEY, what="f"), format_version=version)
    with pytest.raises(PayloadVersionError, match="format"):
        deserialize(payload, KEY, what="f")
    assert not marker.exists()


def test_other_serializer_is_a_version_error() -> None:
    payload = _with_meta(serialize(1, KEY, what="f"), serializer="dill")
    with pytest.raises(PayloadVersionError, match="dill"):
        deserialize(payload, KEY, what="f")


def test_signed_but_unloadable_payload_is_a_serialization_error() -> None:
    from shoal.serialization import _sign  # internal: forge a correctly signed bad pickle

    data = b"\x80\x05cno_such_module_xyz\nthing\n."
    payload = _with_meta(serialize(1, KEY, what="f"), hmac_sha256=_sign(KEY, data))
    with pytest.raises(SerializationError, match="no_such_module_xyz"):
        deserialize(Payload(data, payload.metadata), KEY, what="f")


def test_unpicklable_closure_variable_is_named() -> None:
    lock = threading.Lock()

    def guarded() -> None:
        with lock:
            pass

    with pytest.raises(PicklingError) as info:
        serialize(guarded, KEY, what="function 'guarded'")
    err = info.value
    assert "closure variable 'lock'" in str(err)
    assert "function 'guarded'" in str(err)
    assert "lock" in err.details["culprit"]
    assert isinstance(err, ValueError)  # PicklingError is an InvalidArgumentError


def test_unpicklable_argument_is_named() -> None:
    lock = threading.Lock()
    with pytest.raises(PicklingError, match="argument 0") as info:
        serialize(((lock,), {}), KEY, what="arguments of 'f'")
    assert "arguments of 'f'" in str(info.value)


def test_unpicklable_keyword_argument_is_named() -> None:
    with pytest.raises(PicklingError, match="keyword argument 'guard'"):
        serialize(((1,), {"ok": 2, "guard": threading.Lock()}), KEY, what="arguments")


def test_golden_v1_payload_still_loads() -> None:
    """Like cloudpickle's old_pickles: what format 1 wrote must keep loading.

    The pickle holds builtins only, so it loads on any Python 3. The Python-version check is
    a policy tested above; the metadata is not signed, so the golden file's recorded
    ``python_version`` is replaced by this interpreter's before reading.
    """
    data = (GOLDEN / "payload.pkl").read_bytes()
    metadata = json.loads((GOLDEN / "metadata.json").read_bytes())
    assert metadata["format_version"] == 1
    assert metadata["serializer"] == "cloudpickle"
    assert metadata["size"] == len(data)
    metadata["python_version"] = python_version()
    payload = Payload(data, json.dumps(metadata).encode())
    assert deserialize(payload, GOLDEN_KEY, what="golden payload") == GOLDEN_OBJECT
    with pytest.raises(PayloadIntegrityError):
        deserialize(payload, KEY, what="golden payload")


def test_the_job_runtime_copy_holds_the_private_json_codec(tmp_path: Path) -> None:
    """An isolated job imports shoal only from the runtime copy (envs/_runtime.py)."""
    import subprocess
    import sys

    from shoal.envs._runtime import ensure_runtime

    runtime = ensure_runtime(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import shoal.jobs._entrypoint, "
            "shoal.jobs._executor; from shoal._internal.jsoncodec import dumps, loads; "
            "import shoal; assert shoal.__file__.startswith(sys.argv[1]), shoal.__file__; "
            "print(dumps(loads('{\"b\": 1, \"a\": [2]}'), sort_keys=True))")
    proc = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(runtime)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '{"a": [2], "b": 1}'
