"""The text files of a bundle, from the templates shipped in ``shoal/bundles/templates``.

Each target's entry module is its template with the shared runtime (``templates/runtime.py``)
inlined, so a bundle is one Python file plus its model: no shoal, no second module to lose.
The templates are real Python, linted with the rest of the code; the build only merges their
imports, joins their bodies and sets the constants at the top (``ROUTE``, ``AUTH_LEVEL``).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass
from importlib import metadata, resources
from string import Template
from typing import Any

from shoal.bundles._options import AuthLevel, BundleTarget

__all__ = ["ENTRY_FILES", "EXTRA_FILES", "entry_module", "readme", "requirements",
           "static_file"]

#: The generated entry module of each target (what its platform loads).
ENTRY_FILES = {BundleTarget.AZURE_FUNCTIONS: "function_app.py",
               BundleTarget.AWS_LAMBDA: "lambda_function.py",
               BundleTarget.CONTAINER: "serve.py",
               BundleTarget.ASGI: "app.py"}
_ENTRY_TEMPLATES = {BundleTarget.AZURE_FUNCTIONS: "azure_functions.py",
                    BundleTarget.AWS_LAMBDA: "aws_lambda.py",
                    BundleTarget.CONTAINER: "asgi.py",
                    BundleTarget.ASGI: "asgi.py"}
#: Files besides the entry, model, requirements, README and sample, by target.
EXTRA_FILES: dict[BundleTarget, tuple[str, ...]] = {
    BundleTarget.AZURE_FUNCTIONS: ("host.json", "local.settings.json", ".funcignore"),
    BundleTarget.CONTAINER: ("Dockerfile", ".dockerignore"),
}
_LOCAL_SETTINGS = {"IsEncrypted": False,
                   "Values": {"FUNCTIONS_WORKER_RUNTIME": "python", "AzureWebJobsStorage": "",
                              # older hosts index the v2 programming model only with this flag
                              "AzureWebJobsFeatureFlags": "EnableWorkerIndexing"}}
_RUNTIME_MODULE = "runtime"


def _template(name: str) -> str:
    return (resources.files("shoal.bundles") / "templates" / name).read_text(encoding="utf-8")


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def requirements(target: BundleTarget) -> list[str]:
    """Pinned to what the model was built and checked with (numpy, onnxruntime); the platform's
    own library in the range that platform supports."""
    lines = [f"numpy=={metadata.version('numpy')}",
             f"onnxruntime=={metadata.version('onnxruntime')}"]
    if target == BundleTarget.AZURE_FUNCTIONS:
        # azure-functions 2.x requires Python 3.13 and 1.x stops below it.
        lines += ['azure-functions>=1.20,<2; python_version < "3.13"',
                  'azure-functions>=2,<3; python_version >= "3.13"']
    elif target in (BundleTarget.CONTAINER, BundleTarget.ASGI):
        lines.append("uvicorn>=0.30,<1")
    return lines


# --- the entry module ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Parts:
    docstring: str | None
    imports: list[ast.Import | ast.ImportFrom]
    body: str


def _split(source: str) -> _Parts:
    """A module's docstring, its top-level imports (all before any other statement), the rest."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    statements = list(tree.body)
    docstring = ast.get_docstring(tree, clean=False)
    if docstring is not None:
        statements.pop(0)
    imports: list[ast.Import | ast.ImportFrom] = []
    while statements and isinstance(first := statements[0], ast.Import | ast.ImportFrom):
        imports.append(first)
        statements.pop(0)
    start = statements[0].lineno - 1 if statements else len(lines)
    # Comments just above the first statement belong to it.
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return _Parts(docstring, imports, "".join(lines[start:]).strip("\n") + "\n")


def _merge_imports(nodes: list[ast.Import | ast.ImportFrom]) -> str:
    plain: set[str] = set()
    froms: dict[str, set[str]] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            plain.update(f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                         for a in node.names)
        elif node.module and node.module != "__future__" and node.module != _RUNTIME_MODULE:
            froms.setdefault(node.module, set()).update(
                a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    statements = [(line.split()[1], line) for line in plain]
    statements += [(module, f"from {module} import {', '.join(sorted(names))}")
                   for module, names in froms.items()]

    def group(module: str) -> int:
        return 0 if module.split(".")[0] in sys.stdlib_module_names else 1

    ordered = sorted(statements, key=lambda s: (group(s[0]), s[1].startswith("from"), s[0]))
    text, last = [], None
    for module, line in ordered:
        if last is not None and group(module) != last:
            text.append("")
        text.append(line)
        last = group(module)
    return "\n".join(text) + "\n"


def _set_constant(source: str, name: str, value: str) -> str:
    pattern = re.compile(rf"^{name} = .*$", re.MULTILINE)
    if len(pattern.findall(source)) != 1:  # a template changed under us: fail the build
        raise RuntimeError(f"template constant {name} not found exactly once")
    return pattern.sub(lambda _m: f"{name} = {value}", source)


def entry_module(target: BundleTarget, *, route: str, auth_level: AuthLevel | None,
                 header: str) -> str:
    """The entry module of *target*: its template with the runtime inlined."""
    runtime = _split(_template(f"{_RUNTIME_MODULE}.py"))
    entry = _split(_template(_ENTRY_TEMPLATES[target]))
    doc = (entry.docstring or "").strip("\n")
    body = entry.body
    if target != BundleTarget.AWS_LAMBDA:
        body = _set_constant(body, "ROUTE", json.dumps(route))
    if target == BundleTarget.AZURE_FUNCTIONS and auth_level is not None:
        body = _set_constant(body, "AUTH_LEVEL", f"func.AuthLevel.{auth_level.name}")
    return (f'"""{doc}\n\n{header}\n"""\n\n'
            f"{_merge_imports(runtime.imports + entry.imports)}\n"
            "# --- the model runtime (the same in every shoal bundle) "
            f"{'-' * 36}\n\n{runtime.body}\n\n"
            f"# --- the {target} entry point {'-' * max(4, 68 - len(target))}\n\n{body}")


# --- other files --------------------------------------------------------------------------

def static_file(target: BundleTarget, name: str) -> str:
    if name == "local.settings.json":
        return json.dumps(_LOCAL_SETTINGS, indent=2) + "\n"
    if name == ".funcignore":
        return ".venv\n__pycache__\nlocal.settings.json\nREADME.md\nsample.json\n"
    if name == ".dockerignore":
        return "README.md\nsample.json\n__pycache__\n.venv\n"
    if name == "Dockerfile":
        return Template(_template("Dockerfile")).substitute(python=python_version())
    return _template(name)


def readme(target: BundleTarget, values: dict[str, Any]) -> str:
    values = {**values, "python": python_version()}
    if target == BundleTarget.AZURE_FUNCTIONS:
        function_key = values.get("auth_level") != AuthLevel.ANONYMOUS.value
        values["auth_note"] = (
            " (requests need a key: `?code=KEY` or the `x-functions-key` header)"
            if function_key else " (no key needed; anyone with the URL can call it)")
        route = values["route"]
        values["deployed_test"] = (
            "KEY=$(az functionapp function keys list -g RG -n APP --function-name predict "
            "--query default -o tsv)\n    curl -s -X POST \"https://APP.azurewebsites.net/api/"
            f"{route}?code=$KEY\" -H 'content-type: application/json' -d @sample.json"
            if function_key else
            f"curl -s -X POST https://APP.azurewebsites.net/api/{route} "
            "-H 'content-type: application/json' -d @sample.json")
    return Template(_template(f"README.{target.value}.md")).substitute(values)
