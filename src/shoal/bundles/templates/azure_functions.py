"""Azure Functions app (Python v2 programming model) serving the bundled ONNX model.

``POST /api/<route>`` with ``{"data": [...]}`` answers e.g. ``{"digits": [7]}``; ``"raw": true``
(or ``?raw=1``) adds the model's outputs; ``GET /api/<route>`` describes the model.
"""

import json

import azure.functions as func
from runtime import get_model, handle

ROUTE = "classify"
AUTH_LEVEL = func.AuthLevel.FUNCTION

app = func.FunctionApp(http_auth_level=AUTH_LEVEL)
get_model()  # load while the host indexes the app, not on the first request


# azure-functions is installed on Azure, not here: its decorator is untyped to mypy.
@app.route(route=ROUTE, methods=["GET", "POST"],  # type: ignore[untyped-decorator]
           auth_level=AUTH_LEVEL)
def predict(req: func.HttpRequest) -> func.HttpResponse:
    if req.method == "GET":
        status, body = 200, json.dumps(get_model().info()).encode()
    else:
        status, body = handle(req.get_body(), req.headers.get("content-type"), req.params)
    return func.HttpResponse(body, status_code=status, mimetype="application/json")
