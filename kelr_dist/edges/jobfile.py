"""Job files for ``kelr run``: read one YAML file and map its sections onto the options model.

A job file is validated completely before anything runs, through the fields of
:mod:`kelr_dist.pipeline.options` (the one place for types, defaults, ranges and messages):
unknown keys and bad values are rejected with the file name and the key's path
(``job.yaml: basis.order: expected 'auto' or a non-negative integer (or a list of them), got
'sixty'``). Relative paths are resolved against the job file's folder, so a job folder can be
moved as a whole.

:data:`LAYOUT` says which section key is which field; the schema with its defaults
(:func:`schema_yaml`) is printed by ``python -m kelr_dist.edges.jobfile``, shown by
``kelr run --help`` and written in ``docs/guide/cli.md`` (a test keeps that copy up to date).

Observables ``A(x)`` (``x`` is ``(n, d)``, the result ``(n, q)``): ``identity`` (named after the
store's components), ``square`` (``x**2`` per component, named ``<component>^2``) or a reference
``{function: "package.module:function", names: [a1, a2]}`` — an importable function
``x (n, d) -> (n, q)`` and the names of its ``q`` components (required).

Forcings ``c(x)`` (their components are the store's components): ``constant`` (``c = 1``, so
``B = -grad log p``), ``linear`` (``c_i(x) = x_i``), a reference ``"package.module:function"``
(or ``{function: ...}``) — an importable function ``x (n, d) -> (c (n, d), dc (n, d))`` with
``dc_i = d c_i / d x_i`` — or, for a field, a pattern over its grid ``pattern=FILE:VARIABLE``: a
variable over the field's spatial dims in a netCDF file or zarr store (a relative ``FILE`` is
taken relative to the job file's folder).

References (also ``baselines.score``) are imported with :mod:`importlib` (never evaluated): the
module must be importable by this process and by every Dask worker (installed, or on
``PYTHONPATH``).
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from kelr_dist.pipeline.options import (
    FIELDS,
    ClusterOptions,
    EstimateOptions,
    FileOptions,
    OptionsError,
    PatternFile,
    checked,
    error_lines,
    shown,
)

#: section -> key -> field of the options models; a plain string is a top-level key
LAYOUT: dict[str, dict[str, str] | str] = {
    "input": {"store": "store", "variable": "variable", "components": "components"},
    "estimator": {
        "method": "estimator",
        "degree": "degree",
        "folds": "folds",
        "stein_correction": "stein_correction",
        "pilot": "pilot",
    },
    "basis": {
        "spec": "basis",
        "order": "order",
        "max_order": "max_order",
        "index_set": "index_set",
        "neighbours": "neighbours",
        "symmetry": "symmetry",
    },
    "observable": "observable",
    "forcing": "forcing",
    "lags": {"max_lag": "max_lag", "max_time": "max_time"},
    "delta": "delta",
    "reduce": "reduce",
    "baselines": {"exact": "exact", "score": "score", "kde": "kde", "gaussian": "gaussian"},
    "outputs": {
        "result": "result",
        "netcdf": "netcdf",
        "figures": "figures",
        "overwrite": "overwrite",
    },
    "cluster": {"scheduler": "scheduler", "workers": "workers", "memory_limit": "memory_limit"},
}

#: field -> its key path in a job file
KEY_PATHS = {
    field: section if isinstance(keys, str) else f"{section}.{key}"
    for section, keys in LAYOUT.items()
    for key, field in ({section: keys} if isinstance(keys, str) else keys).items()
}


class JobError(ValueError):
    """A job file that breaks the schema (message: file, key path, problem)."""


#: deepest nesting of lists and mappings a YAML document may have (the composer recurses once
#: per level: a few hundred levels would exhaust Python's stack)
MAX_YAML_DEPTH = 64


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases (``*name``): a few hundred bytes of nested aliases
    ("billion laughs") would expand to gigabytes before anything could be validated; and
    without nesting deeper than ``MAX_YAML_DEPTH`` levels."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{event.anchor}) are not allowed here; write the value out",
                event.start_mark,
            )
        if self.depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"lists and mappings nested deeper than {MAX_YAML_DEPTH} levels are not read",
                self.peek_event().start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml(text: str) -> Any:
    """``text`` read as YAML without aliases (:class:`_NoAliasLoader`); the work and memory
    are then linear in the text's length.

    Raises
    ------
    yaml.YAMLError
        invalid YAML, or an alias.
    """
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader


def _field(name: str) -> tuple[Any, Any]:
    return FIELDS[name].annotation, FIELDS[name]


_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_default=True)
#: the file's structure: one model per section, whose keys are the options' own fields
_Document: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "JobFile",
    __config__=_CONFIG,
    **{
        section: _field(keys)
        if isinstance(keys, str)
        else (
            create_model(  # type: ignore[call-overload]
                section, __config__=_CONFIG, **{k: _field(f) for k, f in keys.items()}
            ),
            ...,
        )
        for section, keys in LAYOUT.items()
    },
)


def _allowed(loc: tuple[Any, ...]) -> list[str]:
    keys = LAYOUT if not loc else LAYOUT.get(str(loc[0]), {})
    return list(keys) if isinstance(keys, Mapping) else []


@dataclass(frozen=True)
class Job:
    """A validated job file: its options by model, and its paths made absolute."""

    source: Path
    options: EstimateOptions
    cluster: ClusterOptions
    files: FileOptions

    def _path(self, value: str | None) -> Path | None:
        return None if value is None else self.source.parent / Path(value).expanduser()

    @property
    def store(self) -> Path:
        return self._path(self.files.store)  # type: ignore[return-value]

    @property
    def result(self) -> Path:
        return self._path(self.files.result)  # type: ignore[return-value]

    @property
    def netcdf(self) -> Path | None:
        return self._path(self.files.netcdf)

    @property
    def figures(self) -> Path | None:
        return self._path(self.files.figures)


def parse_job(document: Any, source: str | os.PathLike[str]) -> Job:
    """Validate a parsed job ``document`` (from YAML) whose file is ``source``.

    Relative paths are taken relative to ``source``'s folder.

    Raises
    ------
    JobError
        ``"<file>: <section.key>: <problem>"`` for every bad or unknown key.
    """
    source = Path(source).absolute()
    if not isinstance(document, Mapping):
        raise JobError(
            f"{source.name}: expected a mapping of sections at the top level, got {shown(document)}"
        )
    # an empty section or top-level key (``basis:``) is an absent one
    given = {str(k): v for k, v in document.items() if v is not None}
    given.update({s: {} for s, keys in LAYOUT.items() if isinstance(keys, dict) and s not in given})
    try:
        parsed = _Document.model_validate(given)
    except ValidationError as err:
        where = error_lines(err, lambda loc: ".".join(map(str, loc)) or None, _allowed)
        raise JobError(f"{source.name}: {where}") from None
    flat: dict[str, Any] = {}
    for section, keys in LAYOUT.items():
        value = getattr(parsed, section)
        if isinstance(keys, str):
            flat[keys] = value
        else:
            flat.update({field: getattr(value, key) for key, field in keys.items()})
    try:  # the rules between keys (max_lag with max_time, ...), named by their key paths
        models = [
            checked(
                model,
                {k: v for k, v in flat.items() if k in model.model_fields},
                KEY_PATHS.__getitem__,
            )
            for model in (EstimateOptions, ClusterOptions, FileOptions)
        ]
    except OptionsError as err:
        raise JobError(f"{source.name}: {err}") from None
    options, cluster, files = models
    assert isinstance(options, EstimateOptions)
    if isinstance(options.forcing, PatternFile):  # a relative path, like the others: from here
        options = options.model_copy(update={"forcing": options.forcing.under(source.parent)})
    return Job(source, options, cluster, files)  # type: ignore[arg-type]


def load_job(path: str | os.PathLike[str]) -> Job:
    """Read and validate the job file at ``path`` (schema: :func:`schema_yaml`).

    Raises
    ------
    JobError
        a missing or unreadable file, invalid YAML, or a bad or unknown key (with its path).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise JobError(
            f"{path.name}: cannot read the job file ({type(err).__name__}: {err})"
        ) from None
    try:
        document = load_yaml(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise JobError(f"{path.name}: not valid YAML{at}: {problem}") from None
    return parse_job(document, path)


# --------------------------------------------------------------------------------------------
# the schema, written from the model
# --------------------------------------------------------------------------------------------

#: column of the comments in the schema, and its width
COMMENT_COLUMN, WIDTH = 30, 100


def _yaml_value(name: str) -> str:
    info = FIELDS[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if info.is_required():
        return str(extra["example"])
    return yaml.safe_dump(info.default, default_flow_style=True).removesuffix("\n...\n").strip()


def _entry(key: str, name: str, indent: int) -> list[str]:
    info = FIELDS[name]
    head = f"{' ' * indent}{key}: {_yaml_value(name)}"
    comment = str(info.description) + (" (required)" if info.is_required() else "")
    lines = textwrap.wrap(
        comment, WIDTH - COMMENT_COLUMN - 2, break_long_words=False, break_on_hyphens=False
    )
    first = f"{head:<{COMMENT_COLUMN}}# {lines[0]}"
    return [first, *(f"{'':<{COMMENT_COLUMN}}# {line}" for line in lines[1:])]


def schema_yaml() -> str:
    """The job-file schema with every key's default (an example for a required one) and its
    description, as YAML with comments."""
    lines: list[str] = []
    for section, keys in LAYOUT.items():
        if isinstance(keys, str):
            lines += _entry(section, keys, 0)
            continue
        lines.append(f"{section}:")
        for key, name in keys.items():
            lines += _entry(key, name, 2)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(schema_yaml(), end="")
