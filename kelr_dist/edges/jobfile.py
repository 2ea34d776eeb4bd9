"""Job files for ``kelr run``: one YAML file naming a whole estimate.

A job file is validated completely before anything runs: unknown keys and bad values are
rejected with the file name and the key's path (``job.yaml: basis.order: expected 'auto' or
a non-negative integer, got 'sixty'``). Relative paths are resolved against the job file's
folder, so a job folder can be moved as a whole.

Schema (every key but ``input.store`` and ``outputs.result`` is optional; defaults shown)::

    input:
      store: trajectory.zarr      # trajectory store (zarr), relative to this file
      variable: x                 # trajectory variable in the store
    estimator:
      method: auto                # "auto" (held-out choice), "kernel-embedding" or
                                  # "score-matching"
      degree: auto                # score matching: "auto" or a total degree q >= 1
      folds: 4                    # held-out folds: whole chains or contiguous blocks
    basis:
      spec: auto                  # "auto" or one entry per component, e.g.
                                  # "laguerre(theta=1),hermite" (kelr_dist.kernels.basis_spec)
      order: auto                 # "auto", an order M, or a list [M1, M2] (index_set: box)
      max_order: null             # highest order fitted and scanned (null: by dimension)
      index_set: auto             # "total" (|m|_1 <= M), "box" (m_k <= M_k) or "auto" (total
                                  # unless one coordinate is active: box, paper §5.2)
    observable: identity          # A(x): a built-in name or a function reference (below)
    forcing: constant             # c(x): a built-in name or a function reference (below)
    lags:                         # at most one of:
      max_lag: null               #   largest lag in samples
      max_time: null              #   largest lag in time units
    delta: auto                   # positivity threshold: "auto", "paper" or a number > 0
    baselines:
      exact: false                # exact-FDT response (built-in models, from the store)
      kde: false                  # Gaussian-KDE baseline
      gaussian: false             # quasi-Gaussian FDT baseline
    outputs:
      result: result.zarr         # result store: a zarr folder, or netCDF when it ends in .nc
      netcdf: null                # optional extra netCDF copy of the result
      figures: null               # optional folder for the report's PNG figures
      overwrite: false            # replace existing outputs
    cluster:                      # (``kelr run --scheduler`` overrides ``scheduler``)
      scheduler: null             # address of a running Dask scheduler (tcp://host:8786);
                                  # null: the embedded local cluster (or "synchronous")
      workers: null               # worker processes of the embedded cluster
      memory_limit: null          # memory per embedded worker, e.g. "2GiB"

Observables ``A(x)`` (``x`` is ``(n, d)``, the result ``(n, q)``):

- ``identity`` — ``A(x) = x``, named after the store's components;
- ``square`` — ``A(x) = x**2`` per component, named ``<component>^2``;
- a reference ``{function: "package.module:function", names: [a1, a2]}`` — an importable
  function ``x (n, d) -> (n, q)`` and the names of its ``q`` components (required).

Forcings ``c(x)`` (their components are the store's components):

- ``constant`` — ``c = 1`` (so ``B = -grad log p``);
- ``linear`` — ``c_i(x) = x_i`` (``d c_i / d x_i = 1``);
- a reference ``"package.module:function"`` or ``{function: "package.module:function"}`` —
  an importable function ``x (n, d) -> (c (n, d), dc (n, d))`` with ``dc_i = d c_i / d x_i``.

References are imported with :mod:`importlib` (never evaluated): the module must be
importable by this process and by every Dask worker (installed, or on ``PYTHONPATH``).
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kelr_dist.kernels.basis_spec import parse_basis_spec
from kelr_dist.kernels.response import Forcing, Observable

Order = str | int | tuple[int, ...]

OBSERVABLES = ("identity", "square")
ESTIMATORS = ("auto", "kernel-embedding", "score-matching")
FORCINGS = ("constant", "linear")
INDEX_SETS = ("auto", "total", "box")
DELTA_RULES = ("auto", "paper")


class JobError(ValueError):
    """A job file or a job value that breaks the schema (message: file, key path, problem)."""


class _Invalid(ValueError):
    """A bad value; the caller adds the key path."""


# --------------------------------------------------------------------------------------------
# value checks shared with the command line (raise ValueError without the key path)
# --------------------------------------------------------------------------------------------


def _non_negative_int(value: Any) -> int | None:
    """``value`` as an int when it is a non-negative integer (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        return None
    return int(value)


def check_order(value: Any) -> Order:
    """``"auto"``, a non-negative integer or a list/tuple of them (a box order)."""
    if value == "auto":
        return "auto"
    if isinstance(value, Sequence) and not isinstance(value, str):
        orders = [_non_negative_int(v) for v in value]
        if orders and None not in orders:
            return tuple(orders)  # type: ignore[arg-type]
    elif _non_negative_int(value) is not None:
        return int(value)
    raise _Invalid(f"expected 'auto' or a non-negative integer (or a list of them), got {value!r}")


def check_max_order(value: Any) -> int | tuple[int, ...] | None:
    """``None``, a non-negative integer or a list/tuple of them."""
    if value is None:
        return None
    order = check_order(value)
    if order == "auto":
        raise _Invalid(f"expected a non-negative integer, got {value!r}")
    return order  # type: ignore[return-value]


def check_max_lag(value: Any) -> int | None:
    if value is None:
        return None
    if _non_negative_int(value) is None:
        raise _Invalid(f"expected a non-negative integer (lags in samples), got {value!r}")
    return int(value)


def check_max_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise _Invalid(f"expected a non-negative number (time units), got {value!r}")
    if not math.isfinite(value):
        raise _Invalid(f"expected a finite number, got {value!r}")
    return float(value)


def check_delta(value: Any) -> str | float:
    """``"auto"``, ``"paper"`` or a positive finite number."""
    if value in DELTA_RULES:
        return str(value)
    if (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    ):
        return float(value)
    raise _Invalid(f"expected 'auto', 'paper' or a positive number, got {value!r}")


def check_estimator(value: Any) -> str:
    """One of :data:`ESTIMATORS`."""
    if value not in ESTIMATORS:
        raise _Invalid(f"expected one of {list(ESTIMATORS)}, got {value!r}")
    return str(value)


def check_degree(value: Any) -> str | int:
    """``"auto"`` or a total degree ``>= 1``."""
    if value == "auto":
        return "auto"
    if _non_negative_int(value) is None or value < 1:
        raise _Invalid(f"expected 'auto' or an integer >= 1, got {value!r}")
    return int(value)


def check_folds(value: Any) -> int:
    """Held-out folds: an integer ``>= 2``."""
    if _non_negative_int(value) is None or value < 2:
        raise _Invalid(f"expected an integer >= 2, got {value!r}")
    return int(value)


def check_basis(value: Any) -> str:
    """A basis spec string (``"auto"``, ``"hermite,laguerre(theta=1)"``, ...): the syntax of
    each entry (their number is checked against the store by the estimate)."""
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(
            f"expected a basis spec string like 'auto' or 'hermite,hermite', got {value!r}"
        )
    parse_basis_spec(value, _entry_count(value))
    return value.strip()


def _entry_count(spec: str) -> int:
    """Number of comma-separated entries outside parentheses."""
    depth, count = 0, 1
    for char in spec:
        depth += {"(": 1, ")": -1}.get(char, 0)
        count += char == "," and depth == 0
    return count


def resolve_reference(reference: Any) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (``function`` may be dotted) with importlib."""
    if not isinstance(reference, str) or reference.count(":") != 1:
        raise _Invalid(f"expected a reference 'package.module:function', got {reference!r}")
    module_name, _, attribute = (part.strip() for part in reference.partition(":"))
    if not module_name or not attribute:
        raise _Invalid(f"expected a reference 'package.module:function', got {reference!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise _Invalid(f"cannot import module {module_name!r} of {reference!r}: {err}") from None
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise _Invalid(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, name)
    if not callable(target):
        raise _Invalid(f"{reference!r} is not callable")
    return target


# --------------------------------------------------------------------------------------------
# built-in observables and forcings (module level: picklable for the Dask workers)
# --------------------------------------------------------------------------------------------


def square(x: np.ndarray) -> np.ndarray:
    """``A(x) = x**2`` per component: ``(n, d) -> (n, d)``."""
    return np.square(x)


def square_derivative(x: np.ndarray) -> np.ndarray:
    """``∂_j A_i = 2 x_i δ_ij`` of :func:`square`: ``(n, d) -> (n, d, d)``."""
    out = np.zeros((*x.shape, x.shape[1]))
    idx = np.arange(x.shape[1])
    out[:, idx, idx] = 2.0 * x
    return out


def linear_forcing(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``c_i(x) = x_i`` and ``d c_i / d x_i = 1``: two ``(n, d)`` arrays."""
    return np.array(x, dtype=np.float64), np.ones_like(x, dtype=np.float64)


@dataclass(frozen=True)
class FunctionSpec:
    """An observable or forcing as named in a job: a built-in ``name`` or a ``function``."""

    name: str
    function: Callable[..., Any] | None = None
    names: tuple[str, ...] | None = None

    def observable(self, components: Sequence[str]) -> Observable | None:
        """The :class:`~kelr_dist.kernels.response.Observable` (None: identity) for the store's
        ``components``."""
        if self.name == "identity":
            return None
        if self.name == "square":
            return Observable(tuple(f"{c}^2" for c in components), square, square_derivative)
        assert self.names is not None
        return Observable(self.names, self.function)

    def forcing(self, components: Sequence[str]) -> Forcing | None:
        """The :class:`~kelr_dist.kernels.response.Forcing` (None: constant) for ``components``."""
        if self.name == "constant":
            return None
        function = linear_forcing if self.name == "linear" else self.function
        return Forcing(tuple(components), function)


def check_observable(value: Any) -> FunctionSpec:
    if value in OBSERVABLES:
        return FunctionSpec(value)
    if isinstance(value, str):
        if ":" in value:
            raise _Invalid(
                f"the reference {value!r} needs its component names: write "
                f"{{function: {value!r}, names: [a1, a2, ...]}}"
            )
        raise _Invalid(
            f"expected one of {list(OBSERVABLES)} or a function reference, got {value!r}"
        )
    return _reference(value, names_required=True)


def check_forcing(value: Any) -> FunctionSpec:
    if value in FORCINGS:
        return FunctionSpec(value)
    if isinstance(value, str) and ":" not in value:
        raise _Invalid(f"expected one of {list(FORCINGS)} or a function reference, got {value!r}")
    return _reference(value if isinstance(value, Mapping) else {"function": value}, False)


def _reference(value: Any, names_required: bool) -> FunctionSpec:
    """``{function: "module:function", names: [...]}`` (the key path is added by the caller)."""
    if not isinstance(value, Mapping):
        raise _Invalid(f"expected a name or a mapping with 'function', got {value!r}")
    allowed = {"function", "names"} if names_required else {"function"}
    unknown = sorted(set(map(str, value)) - allowed)
    if unknown:
        raise _Invalid(f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    if "function" not in value:
        raise _Invalid("missing key 'function' ('package.module:function')")
    function = resolve_reference(value["function"])
    names = value.get("names")
    if names_required:
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) and n for n in names)
            or len(set(names)) != len(names)
        ):
            raise _Invalid(
                f"'names' must be a non-empty list of distinct component names, got {names!r}"
            )
        names = tuple(names)
    return FunctionSpec(str(value["function"]), function, names)


# --------------------------------------------------------------------------------------------
# the job
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A validated job file (paths absolute)."""

    source: Path
    store: Path
    variable: str
    estimator: str
    degree: str | int
    folds: int
    basis: str
    order: Order
    max_order: int | tuple[int, ...] | None
    index_set: str
    observable: FunctionSpec
    forcing: FunctionSpec
    max_lag: int | None
    max_time: float | None
    delta: str | float
    exact: bool
    kde: bool
    gaussian: bool
    result: Path
    netcdf: Path | None
    figures: Path | None
    overwrite: bool
    scheduler: str | None
    workers: int | None
    memory_limit: str | int | None

    def estimate_kwargs(self, components: Sequence[str]) -> dict[str, Any]:
        """Keyword arguments of :func:`kelr_dist.pipeline.estimate.estimate_response` (without the
        trajectory and the cluster), for a store with these ``components``."""
        return {
            "variable": self.variable,
            "estimator": self.estimator,
            "degree": self.degree,
            "folds": self.folds,
            "basis": self.basis,
            "order": self.order,
            "max_order": self.max_order,
            "index_set": self.index_set,
            "observable": self.observable.observable(components),
            "forcing": self.forcing.forcing(components),
            "max_lag": self.max_lag,
            "max_time": self.max_time,
            "delta": self.delta,
            "exact": self.exact,
            "kde": self.kde,
            "gaussian": self.gaussian,
        }


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid(f"expected a non-empty string, got {value!r}")
    return value


def _optional_string(value: Any) -> str | None:
    return None if value is None else _string(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {value!r}")
    return value


def _index_set(value: Any) -> str:
    if value not in INDEX_SETS:
        raise _Invalid(f"expected one of {list(INDEX_SETS)}, got {value!r}")
    return str(value)


def _workers(value: Any) -> int | None:
    if value is None:
        return None
    if _non_negative_int(value) is None or value < 1:
        raise _Invalid(f"expected a positive integer, got {value!r}")
    return int(value)


def _memory(value: Any) -> str | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int) or value in ("", 0):
        raise _Invalid(f"expected a memory size like '2GiB' or a number of bytes, got {value!r}")
    return value


Check = Callable[[Any], Any]

# section -> key -> (check, default); a section of None is a top-level scalar key
SCHEMA: dict[str, dict[str, tuple[Check, Any]] | tuple[Check, Any]] = {
    "input": {"store": (_string, ...), "variable": (_string, "x")},
    "estimator": {
        "method": (check_estimator, "auto"),
        "degree": (check_degree, "auto"),
        "folds": (check_folds, 4),
    },
    "basis": {
        "spec": (check_basis, "auto"),
        "order": (check_order, "auto"),
        "max_order": (check_max_order, None),
        "index_set": (_index_set, "auto"),
    },
    "observable": (check_observable, "identity"),
    "forcing": (check_forcing, "constant"),
    "lags": {"max_lag": (check_max_lag, None), "max_time": (check_max_time, None)},
    "delta": (check_delta, "auto"),
    "baselines": {
        "exact": (_boolean, False),
        "kde": (_boolean, False),
        "gaussian": (_boolean, False),
    },
    "outputs": {
        "result": (_string, ...),
        "netcdf": (_optional_string, None),
        "figures": (_optional_string, None),
        "overwrite": (_boolean, False),
    },
    "cluster": {
        "scheduler": (_optional_string, None),
        "workers": (_workers, None),
        "memory_limit": (_memory, None),
    },
}


def _checked(name: str, key: str, check: Check, value: Any) -> Any:
    try:
        return check(value)
    except ValueError as err:  # _Invalid, or a basis-spec error from kelr_dist.kernels.basis_spec
        raise JobError(f"{name}: {key}: {err}") from None


def _validate(document: Any, name: str) -> dict[str, Any]:
    """Flat ``{"section.key": value}`` of checked values with defaults filled in."""
    if not isinstance(document, Mapping):
        raise JobError(f"{name}: expected a mapping of sections at the top level, got {document!r}")
    unknown = sorted(set(map(str, document)) - set(SCHEMA))
    if unknown:
        raise JobError(f"{name}: {unknown[0]}: unknown key; allowed: {', '.join(SCHEMA)}")
    values: dict[str, Any] = {}
    for section, spec in SCHEMA.items():
        given = document.get(section)
        if isinstance(spec, tuple):
            check, default = spec
            values[section] = _checked(name, section, check, default if given is None else given)
            continue
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise JobError(f"{name}: {section}: expected a mapping of keys, got {given!r}")
        unknown = sorted(set(map(str, given)) - set(spec))
        if unknown:
            raise JobError(
                f"{name}: {section}.{unknown[0]}: unknown key; allowed: {', '.join(spec)}"
            )
        for key, (check, default) in spec.items():
            if key not in given:
                if default is ...:
                    raise JobError(f"{name}: {section}.{key}: required key is missing")
                values[f"{section}.{key}"] = default
            else:
                values[f"{section}.{key}"] = _checked(name, f"{section}.{key}", check, given[key])
    if values["lags.max_lag"] is not None and values["lags.max_time"] is not None:
        raise JobError(f"{name}: lags: give max_lag or max_time, not both")
    for key in ("workers", "memory_limit"):
        if values["cluster.scheduler"] is not None and values[f"cluster.{key}"] is not None:
            raise JobError(
                f"{name}: cluster.{key}: applies to the embedded cluster only, "
                "not with cluster.scheduler"
            )
    return values


def parse_job(document: Any, source: str | os.PathLike[str]) -> Job:
    """Validate a parsed job ``document`` (from YAML) whose file is ``source``.

    Relative paths are taken relative to ``source``'s folder.

    Raises
    ------
    JobError
        ``"<file>: <section.key>: <problem>"`` for the first bad or unknown key.
    """
    source = Path(source).absolute()
    v = _validate(document, source.name)

    def path(key: str) -> Path | None:
        value = v[key]
        return None if value is None else source.parent / Path(value).expanduser()

    return Job(
        source=source,
        store=path("input.store"),  # type: ignore[arg-type]
        variable=v["input.variable"],
        estimator=v["estimator.method"],
        degree=v["estimator.degree"],
        folds=v["estimator.folds"],
        basis=v["basis.spec"],
        order=v["basis.order"],
        max_order=v["basis.max_order"],
        index_set=v["basis.index_set"],
        observable=v["observable"],
        forcing=v["forcing"],
        max_lag=v["lags.max_lag"],
        max_time=v["lags.max_time"],
        delta=v["delta"],
        exact=v["baselines.exact"],
        kde=v["baselines.kde"],
        gaussian=v["baselines.gaussian"],
        result=path("outputs.result"),  # type: ignore[arg-type]
        netcdf=path("outputs.netcdf"),
        figures=path("outputs.figures"),
        overwrite=v["outputs.overwrite"],
        scheduler=v["cluster.scheduler"],
        workers=v["cluster.workers"],
        memory_limit=v["cluster.memory_limit"],
    )


def load_job(path: str | os.PathLike[str]) -> Job:
    """Read and validate the job file at ``path`` (see the module docstring for the schema).

    Raises
    ------
    JobError
        a missing or unreadable file, invalid YAML, or a bad or unknown key (with its path).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise JobError(f"{path}: cannot read the job file ({type(err).__name__}: {err})") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise JobError(f"{path.name}: not valid YAML{at}: {problem}") from None
    return parse_job(document, path)
