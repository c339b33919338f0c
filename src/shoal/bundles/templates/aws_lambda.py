"""AWS Lambda handler (``lambda_function.lambda_handler``) serving the bundled ONNX model.

For Lambda function URLs and API Gateway HTTP APIs (payload format 2.0; 1.0 events work too):
``POST`` with ``{"data": [...]}`` answers e.g. ``{"digits": [7]}`` (base64 bodies included);
``"raw": true`` or ``?raw=1`` adds the model's outputs; ``GET`` describes the model.
"""

import base64
import binascii
import json
from typing import Any

from runtime import get_model, handle

get_model()  # load during the init phase, which runs at full CPU, not on the first request


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    http = (event.get("requestContext") or {}).get("http") or {}
    method = (http.get("method") or event.get("httpMethod") or "POST").upper()
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    if method == "GET":
        return _response(200, json.dumps(get_model().info()).encode())
    if method != "POST":
        return _response(405, b'{"error":"use POST (or GET for the model description)"}')
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        try:
            data = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return _response(400, b'{"error":"isBase64Encoded is set but the body is not '
                                  b'base64"}')
    else:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    status, payload = handle(data, headers.get("content-type"),
                             event.get("queryStringParameters") or {})
    return _response(status, payload)


def _response(status: int, body: bytes) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"content-type": "application/json"},
            "body": body.decode(), "isBase64Encoded": False}
