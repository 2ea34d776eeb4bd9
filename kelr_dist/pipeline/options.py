"""The one typed model of an estimate's options: types, defaults, ranges, messages and docs.

:class:`EstimateOptions` holds the keyword options of
:func:`kelr_dist.pipeline.estimate.estimate_response`; :class:`ClusterOptions` where it runs
(its ``client``, ``n_workers``, ``memory_limit`` and ``progress``; the command line's
``--scheduler``, ``--workers``, ``--memory-limit``), :class:`FileOptions` the files of a
``kelr estimate``/``kelr run``. Fields of the Python function alone (``dt``, ``progress``) are
marked :func:`python_only`: no command-line option, no job-file key. The Python
function, the command line (its options are generated from these fields) and job files (their
sections map onto these fields, :mod:`kelr_dist.edges.jobfile`) all validate through them with
:func:`checked`, which turns a pydantic ``ValidationError`` into one line ``<key>: <problem>``
with the key named as the caller's users know it (``order``, ``--order`` or ``basis.order``).

Every field accepts its Python value and the text of a command-line option (``"60"``,
``"90,0"``, ``"1e-7"``). Its values are checked by pydantic's own types and constraints
(``Literal`` choices, ``Field(ge=..., le=...)``, ``Strict()`` booleans, ``StringConstraints``),
each field's refusal one message ``expected <what>, got <value>`` written from them
(:class:`Expected`); specs with a grammar of their own (basis, observable, forcing, reduce,
neighbours, a function reference) by their parsers. This is the one place: the engine and the
store take the validated values as they are. Checks that need the data (a largest lag against
the chain length, a basis spec against the dimension, a degree against memory) stay with the
estimate (:func:`kelr_dist.pipeline.inputs.check_inputs`). This module imports no dask: it is
pure.
"""

from __future__ import annotations

import importlib
import os
import re
import reprlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar, get_args, get_origin

import numpy as np
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    JsonValue,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from kelr_dist.kernels.bases.spec import parse_basis_spec, split_entries
from kelr_dist.kernels.observables.builtin import (
    Angles,
    WrappedJacobian,
    angle_names,
    linear_forcing,
    square,
    square_derivative,
    wrap_bandwidth,
)
from kelr_dist.kernels.observables.distribution import (
    KINDS,
    DistributionSpec,
    PendingDistribution,
    parse_distribution_spec,
)
from kelr_dist.kernels.observables.field import FieldSpec, parse_field_spec
from kelr_dist.kernels.response.operator import (
    Forcing,
    Observable,
    constant_forcing,
    function_reference,
    identity_observable,
)
from kelr_dist.kernels.scores.folds import DEFAULT_FOLDS, MAX_FOLDS
from kelr_dist.kernels.scores.heldout import ESTIMATORS
from kelr_dist.kernels.scores.local import LOCAL_DIMENSION, SYMMETRIES

#: the index sets of the local score model
LOCAL_INDEX_SETS = ("local", "local-adaptive")
INDEX_SETS = ("auto", "total", "box", "adaptive", *LOCAL_INDEX_SETS)
DELTA_RULES = ("auto", "paper")
OBSERVABLES = ("identity", "square", "angles", *KINDS)
FORCINGS = ("constant", "linear")

Name = Callable[[str], str]


class OptionsError(ValueError):
    """Options that break the model: one line ``<key>: <problem>`` per bad key, joined by ``;``."""


#: how much of a bad value an error message quotes: nesting levels, items per container,
#: characters per string and in all (a value can be a deeply nested YAML structure)
SHOWN_LEVELS, SHOWN_ITEMS, SHOWN_CHARS = 3, 6, 120


def shown(value: Any) -> str:
    """A short repr of a bad value for an error message: at most ``SHOWN_LEVELS`` levels,
    ``SHOWN_ITEMS`` items per level and ``SHOWN_CHARS`` characters, ``...`` where cut (the work
    is bounded too: nothing beyond those limits is visited)."""
    limits = reprlib.Repr()
    limits.maxlevel = SHOWN_LEVELS
    limits.maxtuple = limits.maxlist = limits.maxdict = limits.maxset = SHOWN_ITEMS
    limits.maxstring = limits.maxother = limits.maxlong = SHOWN_CHARS
    short = limits.repr(value)
    return short if len(short) <= SHOWN_CHARS else short[: SHOWN_CHARS - 3] + "..."


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is ``message`` as written (no prefix, no template)."""
    return PydanticCustomError("kelr_invalid", "{message}", {"message": message})


# --------------------------------------------------------------------------------------------
# value types: pydantic's own, each with one message "expected <what>, got <value>"
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """The last metadata of a field's ``Annotated`` type: whatever pydantic refuses in the type
    and its constraints (``Field(ge=...)``, ``Strict()``, ``Literal``) is one message ``expected
    <what>, got <value>``, ``<what>`` written from the type and its constraints (or given here).
    A numpy scalar is taken as its Python value, and a bool is refused where no bool is
    expected (``True`` is an ``int`` in Python, and pydantic takes it as 1)."""

    what: str | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        schema = handler(source)
        what = self.what or _phrase(schema)
        takes_bool = "true or false" in _alternatives(schema)

        def check(value: Any, validate: core_schema.ValidatorFunctionWrapHandler) -> Any:
            if isinstance(value, np.generic):
                value = value.item()
            refused = _invalid(f"expected {what}, got {shown(value)}")
            if isinstance(value, bool) and not takes_bool:
                raise refused
            try:
                return validate(value)
            except ValidationError:
                raise refused from None

        return core_schema.no_info_wrap_validator_function(
            check, schema, metadata={"expected": what}
        )


def _integer_phrase(schema: Mapping[str, Any]) -> str:
    low, high = schema.get("ge"), schema.get("le")
    if low is not None and high is not None:
        return f"an integer from {low} to {high}"
    return {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
        low, f"an integer >= {low}"
    )


def _alternatives(schema: Mapping[str, Any]) -> list[str]:
    """What a pydantic core ``schema`` accepts, as phrases (``'auto'``, ``a positive
    integer``, ...)."""
    kind = schema["type"]
    if "expected" in (schema.get("metadata") or {}):
        return [schema["metadata"]["expected"]]
    if kind in ("nullable", "function-before", "function-after", "function-wrap"):
        return _alternatives(schema["schema"])
    if kind == "union":
        return [p for c in schema["choices"] for p in _alternatives(_choice_schema(c))]
    if kind == "literal":
        return [repr(e) for e in schema["expected"]]
    if kind == "int":
        return [_integer_phrase(schema)]
    if kind == "float":
        sign = "positive " if schema.get("gt") == 0 else "non-negative " * (schema.get("ge") == 0)
        finite = "finite " * (schema.get("allow_inf_nan") is False)
        return [f"a {sign}{finite}number"]
    if kind == "bool":
        return ["true or false"]
    if kind == "str":
        return ["a non-empty string" if schema.get("min_length") else "a string"]
    return [kind]


def _choice_schema(choice: Any) -> Mapping[str, Any]:
    return choice[0] if isinstance(choice, tuple) else choice


def _phrase(schema: Mapping[str, Any]) -> str:
    """What a field accepts, in one phrase: ``one of ['a', 'b']`` for a choice of names,
    else its alternatives joined (``'auto', 'paper' or a positive number``)."""
    inner = schema["schema"] if schema["type"] == "nullable" else schema
    found = _alternatives(schema)
    if inner["type"] == "literal" and len(found) > 1:
        return f"one of {list(inner['expected'])}"
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} or {found[-1]}"


#: true or false (not 0/1, not a text: a job file's ``yes`` is YAML's true already)
Flag = Annotated[bool, Strict(), Expected()]
#: a non-empty text, its surrounding spaces dropped
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1), Expected()]
#: a file or folder path: a non-empty text without NUL characters (no file system takes them;
#: ``open`` said only "embedded null byte")
PathText = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, pattern=r"^[^\x00]*$"),
    Expected("a path (a non-empty string without NUL characters)"),
]
#: a non-negative integer
Whole = Annotated[int, Field(ge=0), Expected()]
#: a positive finite number
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False), Expected()]

if TYPE_CHECKING:  # the choices are the kernels' tuples of names: a Literal of them at run time
    Estimator: TypeAlias = str
    IndexSet: TypeAlias = str
    Symmetry: TypeAlias = str
else:
    Estimator, IndexSet, Symmetry = (Literal[c] for c in (ESTIMATORS, INDEX_SETS, SYMMETRIES))


def choices(info: Any) -> tuple[str, ...]:
    """The names a field (its ``FieldInfo``) accepts when it is a ``Literal`` choice, else
    ``()``."""
    return get_args(info.annotation) if get_origin(info.annotation) is Literal else ()


def _items(value: Any) -> list[Any] | None:
    """The items of a list/tuple, or of a comma-separated text with a comma; else None."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")] if "," in value else None
    if isinstance(value, Sequence) or isinstance(value, np.ndarray):
        return list(value)
    return None


def _listed(value: Any) -> Any:
    """A comma-separated text (``"90,0"``) as the list of its items; anything else as it is."""
    return _items(value) if isinstance(value, str) and "," in value else value


def _components(value: Any) -> tuple[str, ...] | None:
    """``None`` (all components) or distinct component names: a list, or a comma-separated
    text (``"x1,x3"``; a single name is a text without a comma)."""
    if value is None:
        return None
    items = [value.strip()] if isinstance(value, str) and "," not in value else _items(value)
    if not items or not all(isinstance(v, str) and v.strip() for v in items):
        raise _invalid(
            "expected component names, comma-separated like 'x1,x3' (or a list), "
            f"got {shown(value)}"
        )
    names = tuple(v.strip() for v in items)
    if len(set(names)) != len(names):
        raise _invalid(f"expected distinct component names, got {shown(value)}")
    return names


#: orders per coordinate: a non-empty list of non-negative integers (or ``"90,0"``)
Orders = Annotated[tuple[Whole, ...], Field(min_length=1)]
Order = Annotated[
    Literal["auto"] | Whole | Orders,
    BeforeValidator(_listed),
    Expected("'auto' or a non-negative integer (or a list of them)"),
]
MaxOrder = Annotated[
    Whole | Orders | None,
    BeforeValidator(_listed),
    Expected("a non-negative integer (or a list of them)"),
]


def _client(value: Any) -> Any:
    """``None``, an address or ``"synchronous"`` (a non-empty string), or a
    ``distributed.Client`` (imported only to check such an object: this module loads no dask)."""
    if value is None or isinstance(value, str):
        if value is not None and not value.strip():
            raise _invalid(f"expected a non-empty string, got {shown(value)}")
        return None if value is None else value.strip()
    from distributed import Client

    if not isinstance(value, Client):
        raise _invalid(
            "expected a distributed.Client, a scheduler address, 'synchronous' or none, "
            f"got {shown(value)}"
        )
    return value


def _basis(value: Any) -> str | tuple[Any, ...]:
    """A spec string (the syntax of each entry; their number is checked against the data by
    the estimate) or a list of coordinates (Python)."""
    if isinstance(value, str) and value.strip():
        try:
            parse_basis_spec(value, len(split_entries(value)))
        except ValueError as err:
            raise _invalid(str(err)) from None
        return value.strip()
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value):
        return tuple(value)
    raise _invalid(
        f"expected a basis spec string like 'auto' or 'hermite,hermite', got {shown(value)}"
    )


#: ``reduce="eof(k)"``: estimate on the leading ``k`` EOFs and lift the response back
_EOF = re.compile(r"eof\(\s*(\d+)\s*\)")


def _reduce(value: Any) -> str | None:
    """``None`` or ``"eof(k)"`` with ``k`` a positive integer (written back as ``"eof(k)"``)."""
    if value is None:
        return None
    match = _EOF.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None or int(match.group(1)) < 1:
        raise _invalid(
            "expected 'eof(k)' with k a positive integer (the leading principal components "
            f"kept), got {shown(value)}"
        )
    return f"eof({int(match.group(1))})"


def eof_modes(reduce: str | None) -> int | None:
    """The number of EOFs of a validated ``reduce`` option (None: no reduction)."""
    match = None if reduce is None else _EOF.fullmatch(reduce)
    return None if match is None else int(match.group(1))


def _neighbours(value: Any) -> Any:
    """A neighbourhood spec (its match with the components is checked against the data)."""
    if value is None or (isinstance(value, str) and value.strip()):
        return None if value is None else value.strip()
    if isinstance(value, dict | list | tuple) and len(value):
        return value
    raise _invalid(f"expected 'ring', 'grid(n1,n2)', a mapping or a list, got {shown(value)}")


def _memory_size(text: str) -> str:
    """A memory size like ``"2GiB"`` of at least one byte (read by ``dask.utils.parse_bytes``,
    imported only for such a text), as given."""
    from dask.utils import parse_bytes

    if parse_bytes(text) < 1:
        raise ValueError(text)
    return text


#: memory per worker: a positive number of bytes, or a size like ``"2GiB"``
Memory = Annotated[
    Annotated[int, Field(ge=1)]
    | Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1), AfterValidator(_memory_size)
    ],
    Expected("a memory size like '2GiB' or a positive number of bytes"),
]


def resolve_reference(reference: Any) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (``function`` may be dotted) with importlib; the
    text is never evaluated. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(reference, str) or reference.count(":") != 1:
        raise ValueError(f"expected a reference 'package.module:function', got {shown(reference)}")
    module_name, _, attribute = (part.strip() for part in reference.partition(":"))
    if not module_name or not attribute:
        raise ValueError(f"expected a reference 'package.module:function', got {shown(reference)}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} of {reference!r}: {err}") from None
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, name)
    if not callable(target):
        raise ValueError(f"{reference!r} is not callable")
    return target


def _score(value: Any) -> Callable[..., Any] | None:
    """``None``, a callable, or a reference ``"package.module:function"`` resolved by import."""
    if value is None or callable(value):
        return value
    try:
        return resolve_reference(value)
    except ValueError as err:
        raise _invalid(str(err)) from None


# --------------------------------------------------------------------------------------------
# observables and forcings by name or reference
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Circle:
    """The components on a circle, for the observables: ``periods`` (0: on the line), ``wraps``
    (wrap points), ``wrapped`` (the values lie in one window ``[wrap, wrap + period]``: the
    identity jumps there) and the number of ``samples``."""

    periods: tuple[float, ...]
    wraps: tuple[float, ...]
    wrapped: tuple[bool, ...]
    samples: int


@dataclass(frozen=True)
class FunctionSpec:
    """An observable or forcing as named in options: a built-in ``name`` or a ``function``."""

    name: str
    function: Callable[..., Any] | None = None
    names: tuple[str, ...] | None = None

    def observable(self, components: Sequence[str], circle: Circle | None = None) -> Observable:
        """The :class:`~kelr_dist.kernels.response.operator.Observable` for the store's
        ``components``, some of them on a ``circle`` (:class:`Circle`): the identity then carries
        the jump of the wrapped angles in its derivative, and ``angles`` gives their cosines and
        sines."""
        periods = (0.0,) * len(components) if circle is None else circle.periods
        if self.name == "identity":
            if circle is None or not any(circle.wrapped):
                return identity_observable(components)
            wrapped = tuple(p if w else 0.0 for p, w in zip(periods, circle.wrapped, strict=True))
            bandwidth = wrap_bandwidth(circle.samples)
            return Observable(
                tuple(components), None, WrappedJacobian(wrapped, circle.wraps, bandwidth)
            )
        if self.name == "angles":
            angles = Angles(tuple(periods))
            return Observable(angle_names(components, periods), angles, angles.derivative)
        if self.name == "square":
            return Observable(tuple(f"{c}^2" for c in components), square, square_derivative)
        assert self.names is not None
        return Observable(self.names, self.function)

    def forcing(self, components: Sequence[str]) -> Forcing:
        """The :class:`~kelr_dist.kernels.response.operator.Forcing` for ``components``."""
        if self.name == "constant":
            return constant_forcing(components)
        function = linear_forcing if self.name == "linear" else self.function
        return Forcing(tuple(components), function)


def _reference(value: Any, names_required: bool) -> FunctionSpec:
    """``{function: "module:function", names: [...]}`` (``names`` for observables only)."""
    if not isinstance(value, Mapping):
        raise _invalid(f"expected a name or a mapping with 'function', got {shown(value)}")
    allowed = {"function", "names"} if names_required else {"function"}
    unknown = sorted(set(map(str, value)) - allowed)
    if unknown:
        raise _invalid(f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    if "function" not in value:
        raise _invalid("missing key 'function' ('package.module:function')")
    try:
        function = resolve_reference(value["function"])
    except ValueError as err:
        raise _invalid(str(err)) from None
    names = value.get("names")
    if names_required:
        if (
            not isinstance(names, list | tuple)
            or not names
            or not all(isinstance(n, str) and n for n in names)
            or len(set(names)) != len(names)
        ):
            raise _invalid(
                f"'names' must be a non-empty list of distinct component names, got {shown(names)}"
            )
        names = tuple(names)
    return FunctionSpec(str(value["function"]), function, names)


def _spec(value: Any, built_ins: Sequence[str], kind: type, names_required: bool) -> Any:
    """An observable (``names_required``) or forcing: ``None`` (the first built-in), an object
    of ``kind``, a built-in name or a reference."""
    if value is None:
        return FunctionSpec(built_ins[0])
    if isinstance(value, FunctionSpec | kind):
        return value
    if value in built_ins:
        return FunctionSpec(value)
    if callable(value):
        name = function_reference(value)
        if names_required:  # an observable's components are named before any pass
            raise _invalid(
                f"a function ({name}) needs the names of its components: pass "
                "kelr_dist.Observable(('a1', 'a2', ...), function) instead"
            )
        return FunctionSpec(name, value)
    if isinstance(value, str) and ":" in value and names_required:
        raise _invalid(
            f"the reference {value!r} needs its component names: write "
            f"{{function: {value!r}, names: [a1, a2, ...]}}"
        )
    if isinstance(value, str) and ":" not in value:
        raise _invalid(
            f"expected one of {list(built_ins)} or a function reference, got {shown(value)}"
        )
    return _reference(value if isinstance(value, Mapping) else {"function": value}, names_required)


def _observable(value: Any) -> FunctionSpec | Observable | DistributionSpec | FieldSpec:
    """An observable; the distribution ones (``pdf``, ``moments``, ``exceedance``, with their
    parameters, :func:`~kelr_dist.kernels.observables.distribution.parse_distribution_spec`) and
    a field's (``mean``, ``eof(k)``, :func:`~kelr_dist.kernels.observables.field.parse_field_spec`)
    as a spec."""
    if isinstance(value, DistributionSpec | FieldSpec):
        return value
    if isinstance(value, str):
        try:
            spec = parse_distribution_spec(value) or parse_field_spec(value)
        except ValueError as err:
            raise _invalid(str(err)) from None
        if spec is not None:
            return spec
    return _spec(value, OBSERVABLES, Observable, names_required=True)


#: how a forcing names a pattern in a file: ``pattern=PATH:VARIABLE``
PATTERN_PREFIX = "pattern="


@dataclass(frozen=True)
class PatternFile:
    """A forcing pattern held in a file, ``pattern=PATH:VARIABLE``: the ``variable`` of a netCDF
    file or zarr store at ``path`` (as written; a relative one is taken relative to ``folder``,
    else to the working directory), read and checked against the field by the estimate
    (:func:`kelr_dist.pipeline.fields.read_pattern`)."""

    path: str
    variable: str
    folder: str | None = None

    @property
    def text(self) -> str:
        """The spec as written, ``pattern=PATH:VARIABLE``."""
        return f"{PATTERN_PREFIX}{self.path}:{self.variable}"

    @property
    def file(self) -> str:
        """The path of the file or store (``~`` expanded, a relative one put under ``folder``)."""
        return os.path.join(self.folder or "", os.path.expanduser(self.path))

    def under(self, folder: str | os.PathLike[str]) -> PatternFile:
        """The same pattern with a relative path taken relative to ``folder`` (a job file's)."""
        return replace(self, folder=os.fspath(folder))


def _pattern_file(text: str) -> PatternFile:
    """``pattern=PATH:VARIABLE`` split at its last colon (a variable's name holds none)."""
    path, colon, variable = text.strip()[len(PATTERN_PREFIX) :].rpartition(":")
    if not (colon and path.strip() and variable.strip()) or "\x00" in path:
        raise _invalid(
            f"expected '{PATTERN_PREFIX}FILE:VARIABLE' (a netCDF file or zarr store and the name "
            f"of its variable), got {shown(text)}"
        )
    return PatternFile(path.strip(), variable.strip())


def is_pattern(value: Any) -> bool:
    """Whether a forcing is a pattern over a field's grid: an ``xarray.DataArray`` or one in a
    file (:class:`PatternFile`)."""
    xarray = sys.modules.get("xarray")  # a DataArray exists only once xarray is imported
    return isinstance(value, PatternFile) or (
        xarray is not None and isinstance(value, xarray.DataArray)
    )


def _forcing(value: Any) -> Any:
    """A forcing: a built-in name, a reference, a function, a ``Forcing``, or a pattern (a
    ``DataArray`` over a field's spatial dims, or ``pattern=PATH:VARIABLE`` naming one in a file:
    :class:`PatternFile`; checked against the field by the estimate)."""
    if is_pattern(value):
        return value
    if isinstance(value, str) and value.strip().startswith(PATTERN_PREFIX):
        return _pattern_file(value)
    if isinstance(value, str) and ":" not in value and value not in FORCINGS:
        raise _invalid(
            f"expected one of {list(FORCINGS)}, a function reference 'package.module:function' "
            f"or a pattern '{PATTERN_PREFIX}FILE:VARIABLE', got {shown(value)}"
        )
    return _spec(value, FORCINGS, Forcing, names_required=False)


# --------------------------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------------------------


def option(
    default: Any,
    description: str,
    *,
    metavar: str | None = None,
    example: str | None = None,
    python_only: bool = False,
) -> Any:
    """A field: its default (``...``: required, shown by an ``example``), one-phrase
    ``description`` (help text, the documented job-file schema) and, for the command line, its
    ``metavar`` (a ``Literal`` choice shows its names: :func:`choices`). ``python_only``: a
    keyword of the Python function alone (neither a command-line option nor a job-file key)."""
    extra: dict[str, JsonValue] = {
        "metavar": metavar,
        "example": example,
        "python_only": python_only,
    }
    return Field(
        default,
        description=description,
        json_schema_extra={k: v for k, v in extra.items() if v} or None,
    )


def python_only(info: Any) -> bool:
    """Whether a field (its ``FieldInfo``) is a keyword of the Python function alone."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return bool(extra.get("python_only"))


def _name(info: ValidationInfo) -> Name:
    """How the caller's users name a field (``order``, ``--order``, ``basis.order``)."""
    return (info.context or {}).get("name", str)


class _Options(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, arbitrary_types_allowed=True, validate_default=True
    )

    def values(self) -> dict[str, Any]:
        """The fields as keyword arguments (the validated objects, not copies)."""
        return {name: getattr(self, name) for name in type(self).model_fields}


class EstimateOptions(_Options):
    """The options of an estimate (keywords of ``estimate_response``)."""

    variable: Text = option("x", "trajectory variable in the store")
    components: Annotated[tuple[str, ...] | None, BeforeValidator(_components)] = option(
        None,
        "estimate on these components only: names, comma-separated ('x1,x3') or a list "
        "(none: all of them)",
        metavar="NAMES",
    )
    estimator: Annotated[Estimator, Expected()] = option(
        "auto",
        "score estimate: the paper's kernel embedding, score matching (Hyvärinen 2005) or auto "
        "(the one with the smaller held-out Hyvärinen loss)",
    )
    degree: Annotated[Literal["auto"] | Annotated[int, Field(ge=1)], Expected()] = option(
        "auto",
        "score matching: 'auto' (held-out loss) or a total degree q >= 1",
        metavar="auto|Q",
    )
    folds: Annotated[int, Field(ge=2, le=MAX_FOLDS), Expected()] = option(
        DEFAULT_FOLDS,
        f"held-out folds (an integer from 2 to {MAX_FOLDS}): whole chains or contiguous blocks "
        "of each chain",
        metavar="K",
    )
    stein_correction: Flag = option(
        True,
        "refit the estimated scores by the Stein correction: affine, on the observable's own "
        "functions when it is not affine, and on the site sums of a tied local model (false: "
        "the paper's uncorrected estimators)",
    )
    pilot: Flag = option(
        True,
        "with estimator auto on long data, fit the kernel embedding to a subsample first and "
        "carry it on only if it can win (false: both families fitted to all samples)",
    )
    basis: Annotated[Any, BeforeValidator(_basis)] = option(
        "auto",
        "'auto' or one entry per component, e.g. 'laguerre(theta=1),hermite' "
        "(kelr_dist.kernels.bases.spec)",
        metavar="auto|SPEC",
    )
    order: Order = option(
        "auto",
        "kernel embedding: 'auto' (criteria of the paper's §4), an order M, or M1,M2 per "
        "coordinate (index set box)",
        metavar="auto|M|M1,M2",
    )
    max_order: MaxOrder = option(
        None, "highest order fitted and scanned (none: by dimension)", metavar="M"
    )
    index_set: Annotated[IndexSet, Expected()] = option(
        "auto",
        "multi-indices: auto (kernel embedding: total degree |m| <= M, or box when only one "
        "coordinate is active, paper §5.2; score matching: its set grown by held-out loss from "
        "its total degree, budget by the number of samples, local from "
        f"{LOCAL_DIMENSION} components on), total (fixed total degree for both), box "
        "m_k <= M_k, adaptive (auto, with no degree given), local: score matching per "
        "component on its neighbourhood, local-adaptive: local with its index set grown by "
        "held-out loss",
    )
    neighbours: Annotated[Any, BeforeValidator(_neighbours)] = option(
        None,
        "the local score model's neighbourhoods: 'ring', 'grid(n1,n2)', a mapping of component "
        "names to their neighbours, or a list of neighbour lists (none: the store's "
        "'neighbours' attribute, else the data's partial correlations); implies "
        "index_set local",
        metavar="SPEC",
    )
    symmetry: Annotated[Symmetry, Expected()] = option(
        "none",
        "the local score model: 'translation' ties the weights of every site (a ring or a "
        "periodic grid)",
    )
    observable: Annotated[Any, BeforeValidator(_observable)] = option(
        "identity",
        "A(x): 'identity', 'square', 'angles' ((cos, sin) of the periodic components, the "
        "others as they are), for a field 'mean', 'mean(weights=cos(lat))' or 'eof(k)'; a "
        "distribution: 'pdf(bins=40,kernel=cubic)' (smooth bins), 'moments' (centred moments "
        "1-4), 'exceedance(quantiles=0.01,...,0.99,width=0.05)' (probabilities above "
        "quantiles), parameters optional; or {function: 'package.module:function', names: [...]}",
    )
    forcing: Annotated[Any, BeforeValidator(_forcing)] = option(
        "constant",
        "c(x): 'constant', 'linear', a reference 'package.module:function', or a pattern over a "
        "field's grid 'pattern=FILE:VARIABLE' (a variable over the field's spatial dims in a "
        "netCDF file or zarr store; in Python also a DataArray)",
        metavar="SPEC",
    )
    max_lag: Whole | None = option(
        None, "largest lag in samples (not with a largest lag in time units)", metavar="S"
    )
    max_time: Annotated[float, Field(ge=0, allow_inf_nan=False), Expected()] | None = option(
        None, "largest lag in time units (not with a largest lag in samples)", metavar="T"
    )
    delta: Annotated[Literal["auto", "paper"] | Positive, Expected()] = option(
        "auto", "positivity threshold: 'auto', 'paper' or a number > 0", metavar="auto|paper|X"
    )
    exact: Flag = option(
        False,
        "also the exact-FDT response, with the built-in model's score (from the store) or "
        "the given score",
    )
    score: Annotated[Callable[..., Any] | None, BeforeValidator(_score)] = option(
        None,
        "score function 'package.module:function' (x -> grad log p, (n, d) arrays), imported, "
        "never evaluated, here and on the workers: the exact-FDT reference for any store",
        metavar="MODULE:FUNCTION",
    )
    kde: Flag = option(False, "also the Gaussian-KDE baseline (d <= 3)")
    gaussian: Flag = option(False, "also the quasi-Gaussian FDT baseline")
    dt: Positive | None = option(
        None,
        "sample interval of a trajectory given as an array (none: 1, lags counted in steps)",
        python_only=True,
    )
    reduce: Annotated[str | None, BeforeValidator(_reduce)] = option(
        None,
        "'eof(k)': estimate on the leading k EOFs (principal components, one pass of covariance "
        "sums) and lift the response back to the components: the response of the projected "
        "dynamics (none: on the components themselves)",
        metavar="eof(K)",
    )

    @model_validator(mode="after")
    def _together(self, info: ValidationInfo) -> EstimateOptions:
        name = _name(info)
        if self.max_lag is not None and self.max_time is not None:
            raise _invalid(f"give {name('max_lag')} or {name('max_time')}, not both")
        if isinstance(self.order, tuple) and self.index_set == "total":
            raise _invalid(
                f"a per-coordinate {name('order')} {self.order} needs "
                f"{name('index_set')}='box', got 'total'"
            )
        if self.neighbours is not None and self.index_set not in ("auto", *LOCAL_INDEX_SETS):
            raise _invalid(
                f"{name('neighbours')} is for the local score model: leave "
                f"{name('index_set')}='auto' or give 'local' or 'local-adaptive', got "
                f"{self.index_set!r}"
            )
        if self.index_set == "adaptive" and self.degree != "auto":
            raise _invalid(
                f"{name('index_set')}='adaptive' grows the score-matching set itself: leave "
                f"{name('degree')}='auto', got {self.degree!r}"
            )
        if self.reduce is not None:
            self._check_reduce(name)
        if isinstance(self.order, int) and isinstance(self.max_order, int):
            if self.order > self.max_order:
                raise _invalid(
                    f"{name('order')}={self.order} is above {name('max_order')}={self.max_order}"
                )
        return self

    def _check_reduce(self, name: Name) -> None:
        """What ``reduce`` cannot lift back to the components: another observable than the
        identity, another forcing than a constant one, or an exact score (of the full system,
        not of the projected dynamics)."""
        given = self.function_names()
        lifted = f"{name('reduce')}={self.reduce!r} lifts the response of the EOF amplitudes"
        if given["observable"] != OBSERVABLES[0]:
            raise _invalid(
                f"{lifted} to constant forcings: it needs {name('observable')}='identity', "
                f"got {given['observable']!r}"
            )
        if given["forcing"] != FORCINGS[0]:
            raise _invalid(
                f"{lifted} to constant forcings: it needs {name('forcing')}='constant', got "
                f"{given['forcing']!r}"
            )
        for key in ("exact", "score"):
            if getattr(self, key) not in (False, None):
                raise _invalid(
                    f"{name(key)}: an exact score is the full system's, not the projected "
                    f"dynamics' of {name('reduce')}={self.reduce!r}"
                )

    def observable_for(
        self, components: Sequence[str], circle: Circle | None = None
    ) -> Observable | PendingDistribution | FieldSpec:
        """The observable ``A`` for a store with these ``components`` (some on a ``circle``; a
        distribution observable's grid waits for the data's survey, a field's observable for
        the field's grid: :func:`kelr_dist.pipeline.fields.field_observable`)."""
        spec = self.observable
        if isinstance(spec, DistributionSpec):
            return PendingDistribution(spec, tuple(components))
        if isinstance(spec, FieldSpec):
            return spec
        return spec if isinstance(spec, Observable) else spec.observable(components, circle)

    def forcing_for(self, components: Sequence[str]) -> Forcing:
        """The forcing ``c`` for a store with these ``components`` (a pattern runs as the
        constant forcing, with the pattern's own column added once the field's grid is known:
        :mod:`kelr_dist.pipeline.fields`)."""
        spec = self.forcing
        if is_pattern(spec):
            return constant_forcing(components)
        return spec if isinstance(spec, Forcing) else spec.forcing(components)

    def function_names(self) -> dict[str, str]:
        """``{"observable": ..., "forcing": ...}`` as a result records them: a built-in's name,
        the reference given, or an object's function as ``module:qualname``; ``"pattern"`` for a
        pattern, and for one in a file ``"forcing_pattern": "pattern=/absolute/path:VARIABLE"``."""
        names = {
            "observable": _spec_name(self.observable, OBSERVABLES[0]),
            "forcing": "pattern"
            if is_pattern(self.forcing)
            else _spec_name(self.forcing, FORCINGS[0]),
        }
        if isinstance(self.forcing, PatternFile):  # and the file the pattern came from
            file = os.path.abspath(self.forcing.file)
            names["forcing_pattern"] = f"{PATTERN_PREFIX}{file}:{self.forcing.variable}"
        return names


def _spec_name(
    spec: FunctionSpec | Observable | Forcing | DistributionSpec | FieldSpec, built_in: str
) -> str:
    if isinstance(spec, DistributionSpec | FieldSpec):
        return spec.text
    if isinstance(spec, FunctionSpec):
        return spec.name
    function = spec.function
    name = built_in if function is None else function_reference(function)
    if isinstance(spec, Forcing) and spec.pattern_names:  # and the patterns' own columns
        return f"{name} and the patterns {', '.join(spec.pattern_names)}"
    return name


#: field -> keyword of ``estimate_response``, where they differ (accepted as aliases)
PYTHON_NAMES = {"scheduler": "client", "workers": "n_workers"}


def python_name(field: str) -> str:
    """The keyword of ``estimate_response`` for a field (:data:`PYTHON_NAMES`, else its name)."""
    return PYTHON_NAMES.get(field, field)


class ClusterOptions(_Options):
    """Where an estimate runs, and how it shows its progress. The Python function names two
    fields otherwise (``client``, ``n_workers``: :data:`PYTHON_NAMES`)."""

    scheduler: Annotated[Any, BeforeValidator(_client)] = Field(
        None,
        validation_alias=AliasChoices("scheduler", PYTHON_NAMES["scheduler"]),
        description="address of a running Dask scheduler (tcp://host:8786) or 'synchronous' "
        "(no cluster); none: DASK_SCHEDULER_ADDRESS, else the embedded local cluster",
        json_schema_extra={"metavar": "ADDR"},
    )
    workers: Annotated[int, Field(ge=1), Expected()] | None = Field(
        None,
        validation_alias=AliasChoices("workers", PYTHON_NAMES["workers"]),
        description="worker processes of the embedded cluster (none: by CPU count)",
        json_schema_extra={"metavar": "N"},
    )
    memory_limit: Memory | None = option(
        None,
        "memory per embedded worker, e.g. '2GiB' (none: 80% of RAM / workers)",
        metavar="SIZE",
    )
    progress: Flag | None = option(
        None, "progress bars (none: when stderr is a terminal)", python_only=True
    )

    @model_validator(mode="after")
    def _together(self, info: ValidationInfo) -> ClusterOptions:
        name = _name(info)
        for key in ("workers", "memory_limit"):
            if self.scheduler is not None and getattr(self, key) is not None:
                raise _invalid(
                    f"{name(key)} applies to the embedded cluster only, "
                    f"not with {name('scheduler')}"
                )
        return self


class FileOptions(_Options):
    """The files of a run: the trajectory store it reads and the outputs it writes."""

    store: PathText = option(
        ..., "trajectory store (zarr), relative to this file", example="trajectory.zarr"
    )
    result: PathText = option(
        ..., "result store: a zarr folder, or netCDF when it ends in .nc", example="result.zarr"
    )
    netcdf: PathText | None = option(None, "optional extra netCDF copy of the result")
    figures: PathText | None = option(None, "optional folder for the report's PNG figures")
    overwrite: Flag = option(False, "replace existing outputs")


MODELS: tuple[type[_Options], ...] = (EstimateOptions, ClusterOptions, FileOptions)
#: every field of the models by name (the names are unique across them)
FIELDS = {name: info for model in MODELS for name, info in model.model_fields.items()}


def error_lines(
    err: ValidationError,
    key: Callable[[tuple[Any, ...]], str | None],
    allowed: Callable[[tuple[Any, ...]], Sequence[str]] = lambda _: (),
) -> str:
    """One line of ``err``: ``<key>: <problem>`` per error, joined by ``"; "``; ``key(loc)``
    names the key (None: a problem of several keys, whose message names them), ``allowed(loc)``
    the keys allowed beside an unknown one."""
    lines = []
    for error in err.errors(include_url=False):
        kind, message, loc = error["type"], error["msg"], tuple(error["loc"])
        if kind == "missing":
            message = "required key is missing"
        elif kind == "extra_forbidden":
            keys = allowed(loc[:-1])
            message = "unknown key" + (f"; allowed: {', '.join(keys)}" if keys else "")
        elif kind in ("model_type", "dict_type"):
            message = f"expected a mapping of keys, got {shown(error.get('input'))}"
        elif kind != "kelr_invalid":
            message = f"{message}, got {shown(error.get('input'))}"
        where = key(loc)
        lines.append(message if where is None else f"{where}: {message}")
    return "; ".join(lines)


M = TypeVar("M", bound=_Options)


def checked(model: type[M], values: Mapping[str, Any], name: Name = str) -> M:
    """``model`` validated from ``values``; ``name(field)`` is how the caller's users name a
    field, in the messages of the raised :class:`OptionsError`."""
    try:
        return model.model_validate(dict(values), context={"name": name})
    except ValidationError as err:
        message = error_lines(err, lambda loc: name(str(loc[0])) if loc else None)
        raise OptionsError(message) from None
