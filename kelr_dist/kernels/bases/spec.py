"""The basis spec grammar: parse a per-coordinate spec string, write coordinates back as one.

Spec (``spec`` argument, also the ``basis`` attribute of results): ``"auto"`` for every
coordinate, or one comma-separated entry per coordinate, each ``auto``, ``hermite``,
``hermite(beta=..,loc=..,scale=..)``, ``laguerre`` or
``laguerre(theta=..,beta=..,loc=..,scale=..)``, ``fourier(period=..,loc=..)`` with any subset of
the keys (``beta >= 1/2``, ``theta > -1``, ``scale > 0``: the families' own ranges;
``period > 0``); omitted values are
chosen from the data (the family is then fixed; :mod:`kelr_dist.kernels.bases.coordinates`). A
``fourier`` entry declares a periodic component (an angle) of that ``period`` in the data's units
(``fourier(period=360)`` for degrees); ``loc`` is its wrap point (the lower edge of the window
``[loc, loc + period)`` the values are stored in; default: ``-period/2`` or 0, whichever window
holds the data) and ``scale = period / 2π`` maps it to radians (a spec gives ``period`` or
``scale``, not both). A list of :class:`~kelr_dist.kernels.bases.families.Coordinate`,
:class:`~kelr_dist.kernels.bases.families.Hermite` or
:class:`~kelr_dist.kernels.bases.families.Laguerre` (loc and scale from the data) or entry strings
is accepted too. :func:`format_basis` writes a spec that parses back to the same coordinates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from kelr_dist.kernels.bases.families import Coordinate, Fourier, Hermite, Laguerre

_KEYS = {
    "hermite": ("beta", "loc", "scale"),
    "laguerre": ("theta", "beta", "loc", "scale"),
    "fourier": ("period", "loc", "scale"),
}

Entry = tuple[str, dict[str, float]]  # (family name, given parameters) or ("auto", {})


def _parse_value(text: str, key: str, entry: str, position: int) -> float:
    """A parameter's finite number (a ``period`` also positive: the spec's own key); the ranges
    of the others are the families' (:func:`_check_ranges`)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    period = key == "period"
    if not (math.isfinite(value) and (value > 0.0 or not period)):
        need = "period > 0" if period else "a finite number"
        raise ValueError(
            f"basis spec entry {position} ({entry!r}): bad value {text!r} for {key!r}, need {need}"
        )
    return value


def _check_ranges(family: str, params: dict[str, float], entry: str, position: int) -> None:
    """The given parameters of an entry within the ranges of its family (``beta >= 1/2``,
    ``theta > -1``) and of its coordinate (``scale > 0``), as their constructors check them."""
    if family == "auto":
        return
    kind = {"hermite": Hermite, "laguerre": Laguerre, "fourier": Fourier}[family]
    shape = {k: v for k, v in params.items() if k in ("beta", "theta")}
    place = {k: v for k, v in params.items() if k in ("loc", "scale")}
    try:
        Coordinate(kind(**shape), **place)
    except ValueError as err:
        raise ValueError(f"basis spec entry {position} ({entry!r}): {err}") from None


def _parse_entry(entry: str, position: int) -> Entry:
    """One spec entry ``family`` or ``family(key=value, ...)`` -> ``(family, {key: value})``."""
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*", entry)
    family = match.group(1).lower() if match else None
    if (
        match is None
        or family not in ("auto", *_KEYS)
        or (family == "auto" and match.group(2) is not None)
    ):
        raise ValueError(
            f"basis spec entry {position} ({entry!r}): expected 'auto', 'hermite(...)', "
            "'laguerre(...)' or 'fourier(...)'"
        )
    params: dict[str, float] = {}
    body = match.group(2)
    for item in [] if body is None or not body.strip() else body.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if key not in _KEYS[family] or not eq or key in params:
            problem = "duplicate" if key in params else "unknown or malformed"
            raise ValueError(
                f"basis spec entry {position} ({entry!r}): {problem} parameter {item.strip()!r}; "
                f"{family} takes {', '.join(_KEYS[family])}"
            )
        params[key] = _parse_value(value, key, entry, position)
    if "period" in params and "scale" in params:
        raise ValueError(
            f"basis spec entry {position} ({entry!r}): give period or scale "
            "(= period / 2π), not both"
        )
    if "period" in params:
        params["scale"] = params.pop("period") / (2.0 * math.pi)
    _check_ranges(family, params, entry, position)
    return family, params


def split_entries(spec: str) -> list[str]:
    """Split at the commas outside parentheses."""
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    for char in spec:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"basis spec {spec!r}: unbalanced or nested parentheses")
        if char == "," and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"basis spec {spec!r}: unbalanced parentheses")
    return [*entries, "".join(current)]


def _object_entry(item: object, position: int) -> Entry:
    """A Coordinate, a family object or an entry string -> an :data:`Entry`."""
    if isinstance(item, str):
        return _parse_entry(item, position)
    coordinate = item if isinstance(item, Coordinate) else None
    family = coordinate.family if coordinate is not None else item
    if isinstance(family, Hermite):
        name, params = "hermite", {"beta": float(family.beta)}
    elif isinstance(family, Laguerre):
        name, params = "laguerre", {"theta": float(family.theta), "beta": float(family.beta)}
    elif isinstance(family, Fourier):
        name, params = "fourier", {}
    else:
        raise ValueError(
            f"basis spec entry {position}: expected a Coordinate, Hermite, Laguerre, Fourier or "
            f"a string, got {item!r}"
        )
    if coordinate is not None:
        params.update(loc=float(coordinate.loc), scale=float(coordinate.scale))
    return name, params


def parse_basis_spec(spec: str | Sequence[object], d: int) -> list[Entry]:
    """Parse a basis spec for ``d`` coordinates into ``d`` entries ``(family, given params)``.

    ``"auto"`` alone applies to every coordinate; otherwise exactly ``d`` entries are needed.
    Raises :class:`ValueError` naming the offending entry.
    """
    if isinstance(spec, str):
        entries = [_parse_entry(e, i) for i, e in enumerate(split_entries(spec))]
        if len(entries) == 1 and entries[0][0] == "auto":
            entries = entries * d
    else:
        entries = [_object_entry(item, i) for i, item in enumerate(spec)]
    if len(entries) != d:
        raise ValueError(f"basis spec {spec!r} has {len(entries)} entries for {d} coordinates")
    return entries


def coordinates_from_spec(spec: str | Sequence[object], d: int) -> list[Coordinate]:
    """Coordinates from a fully specified spec (as :func:`format_basis` writes); no data needed.

    Raises :class:`ValueError` naming the entry when a family or a parameter is left to the data.
    """
    coordinates = []
    for k, (name, params) in enumerate(parse_basis_spec(spec, d)):
        needed = {"fourier": ("loc", "scale"), "laguerre": ("theta", "beta", "loc", "scale")}.get(
            name, ("beta", "loc", "scale")
        )
        missing = [key for key in needed if key not in params]
        if name == "auto" or missing:
            raise ValueError(
                f"basis entry {k} ({name}) is not fully specified: "
                f"{'missing ' + ', '.join(missing) if missing else 'the family is auto'}"
            )
        family: Hermite | Laguerre | Fourier = (
            Hermite(beta=params["beta"])
            if name == "hermite"
            else Fourier()
            if name == "fourier"
            else Laguerre(theta=params["theta"], beta=params["beta"])
        )
        coordinates.append(Coordinate(family, loc=params["loc"], scale=params["scale"]))
    return coordinates


def format_basis(coordinates: Sequence[Coordinate]) -> str:
    """The spec string of ``coordinates``; :func:`coordinates_from_spec` parses it back to them."""
    entries = []
    for c in coordinates:
        f = c.family
        if isinstance(f, Fourier):
            entries.append(f"fourier(loc={float(c.loc)!r},scale={float(c.scale)!r})")
            continue
        head = f"laguerre(theta={float(f.theta)!r}," if isinstance(f, Laguerre) else "hermite("
        entries.append(
            f"{head}beta={float(f.beta)!r},loc={float(c.loc)!r},scale={float(c.scale)!r})"
        )
    return ",".join(entries)
