"""The package layout: layers as subpackages, the import rule between them, one job per module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kelr_dist"
MODULES = sorted(PACKAGE.rglob("*.py"))
LAYERS = ("kernels", "engine", "data", "pipeline", "edges")

#: layer -> top-level modules and package layers it must never import (at any depth)
FORBIDDEN = {
    "kernels": {
        "dask",
        "distributed",
        "zarr",
        "xarray",
        "kelr_dist.engine",
        "kelr_dist.pipeline",
        "kelr_dist.edges",
        "kelr_dist.data",
    },
    "engine": {"kelr_dist.edges", "kelr_dist.pipeline"},
    "data": {"kelr_dist.edges", "kelr_dist.pipeline"},
}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def _imports(tree: ast.Module, module: str) -> set[str]:
    """Absolute names of every module imported anywhere in ``tree`` (deferred imports too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _violates(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(forbidden + ".")


def test_no_module_at_the_top_level() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py"], f"modules outside the layer subpackages: {top}"
    layers = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert layers == sorted(LAYERS)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_layers_import_only_downwards(path: Path) -> None:
    module = _name(path)
    layer = module.split(".")[1] if module.count(".") else None
    imported = _imports(ast.parse(path.read_text()), module)
    bad = sorted(
        name
        for name in imported
        for forbidden in FORBIDDEN.get(layer or "", ())
        if _violates(name, forbidden)
    )
    assert not bad, f"{module} ({layer}) imports {bad}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_every_module_states_its_job_in_one_sentence(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{_name(path)} has no module docstring"
    first = doc.splitlines()[0].strip()
    assert first.endswith("."), f"{_name(path)}: first line is not a whole sentence: {first!r}"
    assert not re.search(r"[.!?]\s+[A-Z]", first), f"{_name(path)}: more than one sentence"


def test_the_rule_catches_a_kernel_that_imports_dask() -> None:
    tree = ast.parse("def f():\n    import dask.array as da\n    from ..engine import passes\n")
    imported = _imports(tree, "kelr_dist.kernels.lagged")
    assert {"dask.array", "kelr_dist.engine.passes"} <= imported
    assert any(_violates(n, "dask") for n in imported)
