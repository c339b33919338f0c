"""Serializers and deserializers under SageMaker's names, content types and signatures."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from shoal.deserializers import (
    BytesDeserializer,
    CSVDeserializer,
    JSONDeserializer,
    NumpyDeserializer,
    StringDeserializer,
)
from shoal.errors import InvalidArgumentError
from shoal.serializers import CSVSerializer, IdentitySerializer, JSONSerializer, NumpySerializer


class Stream(io.BytesIO):
    """A response body that records being closed, as botocore's StreamingBody is."""


def test_content_types_and_accepts_are_sagemakers():
    assert JSONSerializer().CONTENT_TYPE == "application/json"
    assert CSVSerializer().CONTENT_TYPE == "text/csv"
    assert NumpySerializer().CONTENT_TYPE == "application/x-npy"
    assert IdentitySerializer().CONTENT_TYPE == "application/octet-stream"
    assert IdentitySerializer("image/png").CONTENT_TYPE == "image/png"
    assert JSONDeserializer().ACCEPT == ("application/json",)
    assert CSVDeserializer().ACCEPT == ("text/csv",)
    assert NumpyDeserializer().ACCEPT == ("application/x-npy",)
    assert BytesDeserializer().ACCEPT == ("*/*",)
    assert StringDeserializer().ACCEPT == ("application/json",)
    assert JSONDeserializer(accept=("application/json", "text/csv")).ACCEPT == (
        "application/json", "text/csv")


def test_json_serializer():
    s = JSONSerializer()
    assert json.loads(s.serialize([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert json.loads(s.serialize(np.arange(4).reshape(2, 2))) == [[0, 1], [2, 3]]
    assert json.loads(s.serialize({"inputs": np.array([1.5]), "k": 1})) == {
        "inputs": [1.5], "k": 1}
    assert s.serialize(io.StringIO('{"a": 1}')) == '{"a": 1}'
    with pytest.raises(InvalidArgumentError, match="JSONSerializer cannot serialize object"):
        s.serialize(object())


def test_csv_serializer_rows():
    s = CSVSerializer()
    assert s.serialize([1, 2.5, "x"]) == "1,2.5,x"
    assert s.serialize([[1, 2], [3, 4]]) == "1,2\n3,4"
    assert s.serialize(np.array([[1.0, 2.0], [3.0, 4.0]])) == "1.0,2.0\n3.0,4.0"
    assert s.serialize(np.array([1, 2, 3])) == "1,2,3"
    assert s.serialize("already,csv") == "already,csv"
    with pytest.raises(InvalidArgumentError, match="empty"):
        s.serialize([])
    with pytest.raises(InvalidArgumentError, match="CSVSerializer cannot serialize int"):
        s.serialize(3)


def test_numpy_serializer_round_trips_without_pickle():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    body = NumpySerializer().serialize(data)
    back = np.load(io.BytesIO(body), allow_pickle=False)
    assert back.dtype == np.float32 and (back == data).all()
    listed = np.load(io.BytesIO(NumpySerializer(dtype="float64").serialize([[1, 2]])))
    assert listed.dtype == np.float64 and listed.tolist() == [[1.0, 2.0]]
    with pytest.raises(InvalidArgumentError, match="without pickle"):
        NumpySerializer().serialize(np.array([{"a": 1}], dtype=object))
    with pytest.raises(InvalidArgumentError, match="empty"):
        NumpySerializer().serialize([])
    with pytest.raises(InvalidArgumentError, match="empty"):
        NumpySerializer().serialize(np.zeros((0, 3)))


def test_identity_serializer_passes_data_through():
    assert IdentitySerializer().serialize(b"\x00\x01") == b"\x00\x01"


def test_deserializers_read_and_close_the_stream():
    stream = Stream(b'{"a": [1, 2]}')
    assert JSONDeserializer().deserialize(stream, "application/json") == {"a": [1, 2]}
    assert stream.closed
    assert BytesDeserializer().deserialize(Stream(b"\x00"), "x") == b"\x00"
    assert StringDeserializer().deserialize(Stream("é".encode()), "text/plain") == "é"
    assert CSVDeserializer().deserialize(Stream(b"1,2\n3,4\n"), "text/csv") == [
        ["1", "2"], ["3", "4"]]


def test_json_deserializer_says_what_it_got():
    with pytest.raises(InvalidArgumentError, match="not JSON.*b'oops'"):
        JSONDeserializer().deserialize(Stream(b"oops"), "text/plain")


def test_numpy_deserializer_by_content_type():
    buffer = io.BytesIO()
    np.save(buffer, np.array([[1, 2]], dtype=np.int64))
    d = NumpyDeserializer()
    assert d.deserialize(Stream(buffer.getvalue()), "application/x-npy").tolist() == [[1, 2]]
    assert d.deserialize(Stream(b"[[1, 2]]"), "application/json; charset=utf-8").tolist() == [
        [1, 2]]
    assert d.deserialize(Stream(b"1,2\n3,4"), "text/csv").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(InvalidArgumentError, match="cannot read content type 'image/png'"):
        d.deserialize(Stream(b""), "image/png")


def test_numpy_deserializer_refuses_pickles():
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidArgumentError, match="without pickle"):
        NumpyDeserializer().deserialize(Stream(buffer.getvalue()), "application/x-npy")
    allowed = NumpyDeserializer(allow_pickle=True)
    assert allowed.deserialize(Stream(buffer.getvalue()), "application/x-npy")[0] == {"a": 1}
