"""Run a bundle's entry point as its platform would, inside the bundle's own virtualenv.

``shoal bundle verify`` runs this file by path (``python -I _harness.py BUNDLE TARGET``) with
the interpreter of a fresh environment that holds only the bundle's requirements: it imports
nothing of shoal, and it could not. Requests arrive as JSON on stdin; the answers leave as JSON
on stdout. Azure: ``azure.functions.HttpRequest`` against the function registered on
``function_app.app``; Lambda: function-URL (payload 2.0) events for ``lambda_handler``. The
answers go to a file (the third argument): the bundle may print what it likes.
"""

import base64
import importlib.util
import json
import sys
from typing import Any
from urllib.parse import urlencode


def _azure(bundle: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    import azure.functions as func

    sys.path.insert(0, bundle)
    import function_app

    functions = [f for f in function_app.app.get_functions() if f.is_http_function()]
    if len(functions) != 1:
        raise SystemExit(f"expected one HTTP function in function_app.app, found "
                         f"{[f.get_function_name() for f in functions]}")
    function = functions[0]
    trigger = function.get_trigger()
    route = trigger.route
    user_function = function.get_user_function()
    answers = []
    for r in requests:
        request = func.HttpRequest(method=r["method"], url=f"http://localhost:7071/api/{route}",
                                   headers={"content-type": r["content_type"]},
                                   params=r["query"], route_params={},
                                   body=base64.b64decode(r["body"]))
        response = user_function(request)
        answers.append({"status": response.status_code,
                        "body": response.get_body().decode("utf-8", "replace")})
    return {"answers": answers,
            "function": {"name": function.get_function_name(), "route": route,
                         "methods": sorted(str(getattr(m, "value", m)) for m in trigger.methods),
                         "auth_level": str(getattr(trigger.auth_level, "name",
                                                   trigger.auth_level)).lower()}}


def _lambda(bundle: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    sys.path.insert(0, bundle)
    import lambda_function

    class Context:  # what a handler may read from Lambda's context object
        function_name = "bundle"
        memory_limit_in_mb = 1024
        aws_request_id = "verify"

        @staticmethod
        def get_remaining_time_in_millis() -> int:
            return 30_000

    answers = []
    for r in requests:
        body = base64.b64decode(r["body"])
        encoded = r.get("base64", False)
        event = {
            "version": "2.0", "routeKey": "$default", "rawPath": "/",
            "rawQueryString": urlencode(r["query"]),
            "headers": {"content-type": r["content_type"], "host": "verify.lambda-url.local"},
            "queryStringParameters": r["query"] or None,
            "requestContext": {"http": {"method": r["method"], "path": "/",
                                        "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
                               "routeKey": "$default", "stage": "$default"},
            "body": base64.b64encode(body).decode() if encoded else body.decode(),
            "isBase64Encoded": encoded,
        }
        response = lambda_function.lambda_handler(event, Context())
        answers.append({"status": response["statusCode"], "body": response["body"]})
    return {"answers": answers}


def main() -> None:
    bundle, target, answers = sys.argv[1], sys.argv[2], sys.argv[3]
    requests = json.load(sys.stdin)["requests"]
    result = _azure(bundle, requests) if target == "azure-functions" else \
        _lambda(bundle, requests)
    result["shoal_importable"] = importlib.util.find_spec("shoal") is not None
    with open(answers, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
