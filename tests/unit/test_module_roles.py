"""Which modules are thin path aliases and which hold code (docs/architecture.md, "Naming").

A module that exists only so that a SageMaker import path works (``sagemaker.pytorch.model``)
holds nothing but imports and re-bindings of names, and its docstring starts with
``SageMaker path alias: sagemaker.X — re-exports ...``. No other module carries that line.
``shoal.models[.onnx]``, the older path of ``shoal.export.onnx``, follows the same rule with
``Path alias: shoal.X — ...``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import shoal

SAGEMAKER_ALIAS = "SageMaker path alias: "
PATH_ALIAS = "Path alias: "

#: Every SageMaker path alias, by module name. A new one is added here deliberately.
SAGEMAKER_ALIASES = (
    "shoal.estimator",
    "shoal.model",
    "shoal.predictor",
    "shoal.inputs",
    "shoal.pytorch",
    "shoal.pytorch.estimator",
    "shoal.pytorch.model",
    "shoal.sklearn",
    "shoal.sklearn.estimator",
    "shoal.sklearn.model",
    "shoal.djl_inference",
    "shoal.djl_inference.model",
    "shoal.djl_inference.djl_predictor",
    "shoal.huggingface",
    "shoal.huggingface.estimator",
    "shoal.huggingface.model",
    "shoal.remote_function.client",
    "shoal.remote_function.checkpoint_location",
    "shoal.remote_function.custom_file_filter",
)

#: shoal's own older paths, kept importable.
PATH_ALIASES = ("shoal.models", "shoal.models.onnx")

PACKAGE_DIR = Path(shoal.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _path(module: str) -> Path:
    base = PACKAGE_DIR.parent.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


ALL_MODULES = sorted(_module_name(p) for p in PACKAGE_DIR.rglob("*.py"))


@pytest.mark.parametrize("module", SAGEMAKER_ALIASES)
def test_a_sagemaker_alias_says_so_and_names_its_sagemaker_path(module: str) -> None:
    first = _docstring(_path(module)).splitlines()[0]
    sagemaker_path = "sagemaker" + module[len("shoal"):]
    assert first.startswith(f"{SAGEMAKER_ALIAS}{sagemaker_path} — re-exports "), first


@pytest.mark.parametrize("module", PATH_ALIASES)
def test_a_path_alias_says_so(module: str) -> None:
    first = _docstring(_path(module)).splitlines()[0]
    assert first.startswith(f"{PATH_ALIAS}{module} — "), first


def _code_of_its_own(tree: ast.Module) -> list[str]:
    """What in *tree* is more than a docstring, imports and re-bound names."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and (node.module == "__future__"
                                                  or (node.module or "").startswith("shoal.")):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names == ["__all__"] and isinstance(node.value, ast.List):
                continue
            if isinstance(node.value, ast.Name):  # RealTimePredictor = Predictor
                continue
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "__all__"):
            continue
        found.append(f"line {node.lineno}: {ast.dump(node)[:80]}")
    return found


@pytest.mark.parametrize("module", SAGEMAKER_ALIASES + PATH_ALIASES)
def test_an_alias_holds_no_code_of_its_own(module: str) -> None:
    tree = ast.parse(_path(module).read_text(encoding="utf-8"))
    definitions = [n.name for n in ast.walk(tree)
                   if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    assert definitions == [], f"{module} defines {definitions}: move them to a layered package"
    assert _code_of_its_own(tree) == []


@pytest.mark.parametrize("module", SAGEMAKER_ALIASES + PATH_ALIASES)
def test_every_name_an_alias_exports_is_defined_elsewhere(module: str) -> None:
    mod = importlib.import_module(module)
    exported = list(mod.__all__)
    for name in exported:
        value = getattr(mod, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ != module, f"{module}.{name} is defined in the alias itself"
    if module != "shoal.models":
        assert exported, f"{module} exports nothing"


def test_no_other_module_carries_an_alias_line() -> None:
    assert set(SAGEMAKER_ALIASES + PATH_ALIASES) <= set(ALL_MODULES)
    carriers = {}
    for module in ALL_MODULES:
        doc = _docstring(_path(module))
        if doc.startswith(SAGEMAKER_ALIAS) and module not in SAGEMAKER_ALIASES:
            carriers[module] = doc.splitlines()[0]
        if doc.startswith(PATH_ALIAS) and module not in PATH_ALIASES:
            carriers[module] = doc.splitlines()[0]
    assert carriers == {}, ("these modules say they are aliases but are not listed here; if they"
                            f" hold only re-exports add them, else reword: {carriers}")


def test_modules_with_code_at_sagemaker_paths_are_not_aliases() -> None:
    # The implementations at SageMaker's paths hold code (checked, so the list above is not
    # merely a subset that happens to pass) and do not carry the alias line.
    for module in ("shoal.image_uris", "shoal.utils", "shoal.s3", "shoal.serializers",
                   "shoal.deserializers", "shoal.analytics", "shoal.session",
                   "shoal.experiments.trial_component", "shoal.huggingface.llm_utils",
                   "shoal.export.onnx"):
        tree = ast.parse(_path(module).read_text(encoding="utf-8"))
        assert _code_of_its_own(tree), module
        assert not _docstring(_path(module)).startswith((SAGEMAKER_ALIAS, PATH_ALIAS)), module


def test_the_older_onnx_path_is_the_export_module() -> None:
    from shoal.export import onnx as export_onnx
    from shoal.models import onnx as models_onnx

    assert models_onnx.export is export_onnx.export
    assert models_onnx.export_sklearn is export_onnx.export_sklearn
    assert models_onnx.verify is export_onnx.verify
