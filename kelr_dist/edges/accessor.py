"""The ``Dataset.kelr`` accessor, registered when xarray is imported rather than by the package.

``import kelr_dist`` must stay light (worker processes import it to unpickle a kernel, and xarray
brings pandas), yet ``ds.kelr`` must work in any program that imported the package. So
:func:`register_when_xarray_is_imported` registers at once when xarray is already loaded, and
otherwise puts a finder on ``sys.meta_path`` that lets xarray load as usual and then imports
:mod:`kelr_dist.edges.analysis`, whose class decorator registers the accessor.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType


def _register() -> None:
    from kelr_dist.edges import analysis  # noqa: F401  (its KelrAccessor registers itself)


class _Loader(importlib.abc.Loader):
    """xarray's own loader, followed by the registration."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _register()


class _XarrayFinder(importlib.abc.MetaPathFinder):
    """Finds xarray as the other finders do, once, and wraps its loader in :class:`_Loader`."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,  # noqa: ARG002 - importlib's finder signature
        target: ModuleType | None = None,  # noqa: ARG002
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "xarray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def register_when_xarray_is_imported() -> None:
    """Register ``Dataset.kelr`` now if xarray is loaded, else right after it is imported."""
    if "xarray" in sys.modules:
        _register()
    elif not any(isinstance(finder, _XarrayFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _XarrayFinder())
