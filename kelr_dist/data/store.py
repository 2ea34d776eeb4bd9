"""The trajectory store contract: opening and validating trajectory stores.

A trajectory store is a zarr store that :func:`xarray.open_zarr` opens, holding one
variable (default ``x``) with

- dims ``(time, component)`` or ``(chain, time, component)`` (any order; it is transposed),
  chunked along ``time``; a scalar trajectory may leave ``component`` out (``(time,)``,
  ``(chain, time)``): its one component is named after the variable;
- dtype float32 or float64 (kept as stored), or an integer type (read as float64; bool is
  refused);
- a uniform sample interval: a ``time`` coordinate (numeric; or datetime64 / timedelta64,
  also as xarray encodes them in a store, which gives ``dt`` in seconds), or a ``dt`` attribute
  on the variable or the dataset (when both are given they must agree); its unit is
  ``attrs["time_units"]``: ``"s"`` from dates and durations, else the numeric coordinate's
  ``units`` attribute or a ``time_units`` attribute, else absent (the data's own unit);
- a field instead, dims ``(time, <grid dims>...)`` (e.g. ``(time, lat, lon)``), whose grid points
  become the components (:mod:`kelr_dist.data.fields`: masked points dropped, the layout in
  ``attrs["field"]``);
- optionally a ``component`` coordinate of names (otherwise ``x1, x2, ...``, numbered from 1
  as the built-in models name theirs, the same for every input route);
- attributes saying where it came from (generated stores: ``model``, ``model_params`` (JSON),
  ``seed``, ``burn_in``, ``kelr_dist_version``).

:func:`open_trajectory` (a path) and ``as_trajectory`` (an opened ``Dataset``/``DataArray``)
return a lazily loaded, dask-backed ``DataArray`` with dims always ``("chain", "time",
"component")``, ``attrs["dt"]`` and ``attrs["store"]`` set. Whatever breaks the contract raises
one :class:`TrajectoryError` naming the store, the variable and the problem.

Generated stores are written by :mod:`kelr_dist.data.writer`; :func:`read_progress` reads
their per-chain progress records (an incomplete store's message says how far it got).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from zarr.core.metadata import ArrayV3Metadata

from kelr_dist.data.fields import stacked

DIMS = ("chain", "time", "component")
# most bytes one task may have to read for one block of one chain (see _check_chunks)
MAX_CHUNK_BYTES = 256 * 2**20
#: ``attrs["store"]`` of a trajectory that no store backs (samples held in this process)
IN_MEMORY = "<in-memory>"
# block size used to chunk in-memory (numpy-backed) trajectories: small enough that a 1e7-sample
# array spreads over the workers in tens of tasks (the engine scatters the blocks once, and
# coalesces blocks of a large array into bigger tasks; see kelr_dist.engine.passes)
DEFAULT_BLOCK_BYTES = 4 * 2**20
# a lazily opened time coordinate up to this many entries is checked for uniformity in full
# (streamed chunk by chunk); a longer one at TIME_PROBES evenly spaced entries and its first
# and last chunk, so that opening a 1e10-sample store never reads its whole coordinate
TIME_CHECK_ROWS = 2**22
TIME_PROBES = 64
# relative tolerance on the spacing of a time coordinate (and a time coordinate vs ``dt``)
DT_RTOL = 1e-6
# fewest samples per chain and most components an estimate accepts (kelr_dist.pipeline.estimate):
# orders, held-out folds and block error bars need 1000 samples per chain; the response alone is
# d² lagged sums per lag (and as many per held-out fold for its error bars)
MIN_SAMPLES = 1000
MAX_COMPONENTS = 256
# the client holds a task graph of a few tasks per block (one chain, one time chunk) of a
# store and, on the embedded cluster, the scheduler's task states: the first pass over 1e5
# blocks grew `kelr estimate` by 380 MB, about 4 KiB per block
CLIENT_BYTES_PER_BLOCK = 4 * 2**10
# share of the client machine's available memory the graph of one store may take
CLIENT_MEMORY_SHARE = 0.25
# nesting depth of a JSON attribute (model_params): deeper documents are refused, not parsed
MAX_JSON_DEPTH = 32
# longest attribute text `kelr info` shows as it is
MAX_ATTR_CHARS = 2000
PROVENANCE_ATTRS = ("model", "model_params", "seed", "burn_in", "kelr_dist_version")
PROGRESS_GROUP = "_progress"
PROGRESS_ARRAY = "record"


class TrajectoryError(ValueError):
    """A store or array that breaks the trajectory contract (message names store and variable)."""


def _error(source: str, variable: str, problem: str) -> TrajectoryError:
    return TrajectoryError(f"store {source!r}, variable {variable!r}: {problem}")


def _human_bytes(n: float) -> str:
    power = min(int(math.log(max(n, 1), 1024)), 4)
    return f"{n / 1024**power:.1f} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[power]}"


# --------------------------------------------------------------------------------------------
# reading and validation
# --------------------------------------------------------------------------------------------


def open_trajectory(
    path: str | os.PathLike[str], variable: str = "x", *, dt: float | None = None
) -> xr.DataArray:
    """Open and validate the trajectory store at ``path``.

    Parameters
    ----------
    path : a zarr store (local directory, or a URL xarray can open).
    variable : name of the trajectory variable.
    dt : the sample interval (a positive finite number), for a store without its own (see
        ``as_trajectory``).

    Returns
    -------
    xarray.DataArray
        dask-backed, dims ``("chain", "time", "component")`` (a 2-D store gets a chain of
        length 1), dtype as stored, chunks: one chain and all components per block, time
        chunks as stored. ``attrs`` holds the store's and the variable's attributes plus
        ``dt`` (float) and ``store`` (the path). A ``time`` coordinate is kept when the store
        has one; generated stores carry ``dt`` only (a coordinate of 1e10 times would not fit
        in memory).

    Raises
    ------
    TrajectoryError
        when the store is missing, is not a zarr store, is an incomplete generated store
        (the message says how to resume), or the variable breaks the contract
        (see ``as_trajectory``).

    Notes
    -----
    A local ``path`` is made absolute here (``attrs["store"]`` and the tasks that read the
    store hold the absolute path), so that workers started in another directory read the
    same store. Metadata and coordinates are read in the calling thread (dask's synchronous
    scheduler), never through a default ``distributed.Client``. A ``time`` coordinate is not
    loaded: it stays lazy, its step comes from its first and last entries and its length, and
    its uniformity is checked in full up to ``TIME_CHECK_ROWS`` entries, beyond that at
    ``TIME_PROBES`` evenly spaced entries and in its first and last chunks (a long store had
    better carry a ``dt`` attribute).
    """
    source = os.fspath(path)
    if "://" not in source:
        source = os.path.abspath(source)
        if not Path(source).exists():
            raise _error(source, variable, "the store does not exist")
    _check_metadata(source, variable)
    import dask

    fingerprint = store_fingerprint(source, variable)
    # the coordinates (component names, time probes) are read here, in this thread, never
    # through a default distributed client: a busy or paused cluster would hold the opening up
    with dask.config.set(scheduler="synchronous"):
        ds = open_store_dataset(source, variable)
        if "time" in ds.coords:  # dates and durations decoded as xarray.open_zarr does, lazily
            decoded = xr.decode_cf(xr.Dataset({"t": ds["time"].variable}))["t"].variable
            ds = ds.assign_coords(xr.Coordinates({"time": decoded}, indexes={}))
        trajectory = as_trajectory(stacked(ds, variable, source), variable, source=source, dt=dt)
    if fingerprint is not None:
        trajectory.attrs["store_fingerprint"] = fingerprint
    return trajectory


# --------------------------------------------------------------------------------------------
# a store that changes while it is read
# --------------------------------------------------------------------------------------------


def store_fingerprint(source: str, variable: str) -> str | None:
    """A digest of what a read of ``variable`` in the store at ``source`` depends on: the
    store's and the variable's metadata and attributes, and the key, size and (local stores)
    modification time of every object under the variable, from one listing; None when
    ``source`` does not open as a zarr group holding ``variable``.

    Two fingerprints differ when the store was rewritten, appended to or had a chunk replaced
    in between (:func:`check_unchanged`); the cost is one listing and, locally, one ``stat``
    per chunk file.
    """
    from zarr.core.sync import sync

    try:
        group = zarr.open_group(source, mode="r", use_consolidated=False)
        array = group[variable]
    except Exception:  # not a store: nothing to fingerprint
        return None
    if not isinstance(array, zarr.Array):
        return None
    store = array.store_path.store

    def described(key: str) -> tuple[str, int, int]:
        if "://" in source:
            return key, int(sync(store.getsize(key))), 0
        stat = os.stat(os.path.join(source, key))
        return key, stat.st_size, stat.st_mtime_ns

    try:
        objects = sorted(described(key) for key in _keys(array))
    except OSError:  # a file removed between the listing and its stat: the store is changing
        objects = [("<changing>", 0, time.time_ns())]
    state = {"group": group.attrs.asdict(), "array": array.metadata.to_dict(), "objects": objects}
    text = json.dumps(state, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_unchanged(trajectory: xr.DataArray) -> None:
    """Refuse to go on reading a trajectory whose store changed since it was opened (its
    ``attrs["store_fingerprint"]``, see :func:`store_fingerprint`): a result would mix two
    datasets. Nothing to check for a trajectory without a fingerprint (in memory, not a
    zarr store).

    Raises
    ------
    TrajectoryError
        the store's fingerprint is not the one taken when it was opened.
    """
    taken = trajectory.attrs.get("store_fingerprint")
    source = trajectory.attrs.get("store")
    if not isinstance(taken, str) or not isinstance(source, str) or source == IN_MEMORY:
        return
    variable = str(trajectory.name) if trajectory.name is not None else "x"
    now = store_fingerprint(source, variable)
    if now != taken:
        raise _error(
            source,
            variable,
            f"the store changed while it was read (fingerprint {taken} when it was opened, "
            f"{now or 'no readable store'} now: rewritten, appended to or a chunk replaced); "
            "a result would mix two datasets: estimate again once nothing writes the store",
        )


# --------------------------------------------------------------------------------------------
# the metadata against the data, and reads that name a damaged chunk
# --------------------------------------------------------------------------------------------


def _check_metadata(source: str, variable: str) -> None:
    """Check the variable's metadata against the data before anything is sized from it.

    A ``zarr.json`` (or ``.zarray``) can claim any shape: 1e12 samples in a store of a few
    chunk files would make the client build a task graph without bound. So, from the metadata
    and one listing of the variable's chunk files: the chunk files must reach the last chunk of
    the grid along every axis (a store whose data end earlier has a damaged or hand-edited
    shape), and every chunk of the grid must be stored (a hole would read as the fill value);
    the consolidated copy of the metadata, when there is one, must agree; a generated store's
    ``n_samples`` and ``chains`` must be its shape; and the blocks the client would hold
    (chains x time chunks, ``CLIENT_BYTES_PER_BLOCK`` each) must fit in
    ``CLIENT_MEMORY_SHARE`` of the machine's available memory. Anything that does not open as
    a zarr array is left to :func:`xarray.open_zarr` to name; an incomplete generated store
    (whose chunks are still being written) to its own message.
    """
    try:  # the metadata the data are opened with (OPEN_OPTIONS: not the consolidated copy)
        group = zarr.open_group(source, mode="r", use_consolidated=False)
        array = group[variable]
    except Exception:  # not a store, no such variable: xarray.open_zarr says which
        return
    if not isinstance(array, zarr.Array) or group.attrs.get("complete") is False:
        return
    _check_consolidated(source, variable, array)
    shape = tuple(int(n) for n in array.shape)
    files = tuple(int(n) for n in (array.shards or array.chunks))
    grid = tuple(-(-n // c) for n, c in zip(shape, files, strict=True))
    names = _dimension_names(array)
    stored = _chunk_files(array, len(grid))
    reach = tuple(max((i[a] + 1 for i in stored), default=0) for a in range(len(grid)))
    short = [a for a, (r, g) in enumerate(zip(reach, grid, strict=True)) if r < g]
    if short and all(shape):  # not an empty array
        axis = short[0]
        found = (
            "it has no chunk files"
            if not any(reach)
            else f"its chunk files end at chunk {reach[axis] - 1} along {names[axis]!r} "
            f"(entry {min(reach[axis] * files[axis], shape[axis])})"
        )
        raise _error(
            source,
            variable,
            f"the metadata says shape {shape} ({grid[axis]} chunks of {files[axis]} along "
            f"{names[axis]!r}), but {found}: the metadata (zarr.json) does not match the data; "
            "restore the store or correct its shape",
        )
    if all(shape):
        _check_every_chunk(source, variable, array, stored, grid, names)
    attrs = group.attrs
    for key, dim in (("n_samples", "time"), ("chains", "chain")):
        said = attrs.get(key)
        if (
            "model" in attrs
            and dim in names
            and isinstance(said, int)
            and not isinstance(said, bool)
        ):
            if said != shape[names.index(dim)]:
                raise _error(
                    source,
                    variable,
                    f"the store's attribute {key}={said} disagrees with its shape {shape} "
                    f"({dim!r}: {shape[names.index(dim)]}); the metadata is damaged",
                )
    chunks = tuple(int(n) for n in array.chunks)
    blocks = math.prod(
        -(-n // c) for n, c, dim in zip(shape, chunks, names, strict=True) if dim != "component"
    )
    budget = CLIENT_MEMORY_SHARE * _available_memory()
    if blocks * CLIENT_BYTES_PER_BLOCK > budget:
        raise _error(
            source,
            variable,
            f"{blocks} blocks (chains x time chunks of {chunks}) would take the client about "
            f"{_human_bytes(blocks * CLIENT_BYTES_PER_BLOCK)} of task graph, more than "
            f"{_human_bytes(budget)} ({CLIENT_MEMORY_SHARE:.0%} of this machine's available "
            "memory); rechunk the store into fewer, longer time chunks",
        )


def _check_consolidated(source: str, variable: str, array: zarr.Array) -> None:
    """Refuse a store whose consolidated metadata (the copy in the root ``zarr.json`` or
    ``.zmetadata``) describe ``variable`` otherwise than its own metadata: one of the two was
    edited or damaged, and a reader that trusts the consolidated copy would size its work from
    one and read the data through the other."""
    try:
        copy = zarr.open_group(source, mode="r", use_consolidated=True)[variable]
    except Exception:  # no consolidated metadata, or none for this variable
        return
    for field in ("shape", "chunks", "dtype"):
        own, consolidated = getattr(array, field), getattr(copy, field)
        if own != consolidated:
            raise _error(
                source,
                variable,
                f"its metadata say {field} {own}, but the store's consolidated metadata say "
                f"{consolidated}: one of the two copies was edited or damaged; restore the "
                "store (or rewrite its consolidated metadata with zarr.consolidate_metadata)",
            )


def _dimension_names(array: zarr.Array) -> list[str]:
    """The dims of a zarr array: zarr 3's ``dimension_names``, else xarray's
    ``_ARRAY_DIMENSIONS`` attribute (zarr 2), else ``dim_0, dim_1, ...``."""
    names = getattr(array.metadata, "dimension_names", None)
    names = names or array.attrs.get("_ARRAY_DIMENSIONS")
    if not isinstance(names, list | tuple) or len(names) != array.ndim:
        names = [f"dim_{a}" for a in range(array.ndim)]
    return [str(n) for n in names]


def _keys(array: zarr.Array) -> list[str]:
    """The keys of every object under ``array`` in its store (chunks and metadata), from one
    listing."""
    from zarr.core.sync import sync

    prefix = f"{array.path}/" if array.path else ""

    async def keys() -> list[str]:
        return [key async for key in array.store_path.store.list_prefix(prefix)]

    return sync(keys())


def _chunk_files(array: zarr.Array, ndim: int) -> set[tuple[int, ...]]:
    """The chunk (or shard) indices with a stored object, from one listing of the array's
    keys."""
    separator, lead = _key_format(array)
    prefix = f"{array.path}/" if array.path else ""
    stored = set()
    for key in _keys(array):
        relative = key[len(prefix) :]
        if not relative.startswith(lead):
            continue
        parts = relative[len(lead) :].split(separator)
        if len(parts) == ndim and all(p.isdigit() for p in parts):
            stored.add(tuple(int(p) for p in parts))
    return stored


def _key_format(array: zarr.Array) -> tuple[str, str]:
    """The separator of a chunk key's indices and the prefix before them (``"/"``, ``"c/"``
    for zarr 3's default keys; zarr 2: ``"."`` or ``"/"``, no prefix)."""
    metadata = array.metadata
    if isinstance(metadata, ArrayV3Metadata):
        encoding = metadata.chunk_key_encoding
        separator = getattr(encoding, "separator", "/")
        lead = "" if getattr(encoding, "name", "default") == "v2" else f"c{separator}"
        return separator, lead
    return metadata.dimension_separator or ".", ""


def _check_every_chunk(
    source: str,
    variable: str,
    array: zarr.Array,
    stored: set[tuple[int, ...]],
    grid: tuple[int, ...],
    names: list[str],
) -> None:
    """Refuse a store with a hole: a chunk file of the grid that is not stored (deleted, or
    never written) would be read as the fill value, samples that were never simulated. The
    first missing one is named with its key and the entries it holds; the work is bounded by
    the number of stored chunks."""
    within = sum(all(i < g for i, g in zip(index, grid, strict=True)) for index in stored)
    if within == math.prod(grid):
        return
    missing = next(i for i in itertools.product(*map(range, grid)) if i not in stored)
    separator, lead = _key_format(array)
    prefix = f"{array.path}/" if array.path else ""
    key = prefix + lead + separator.join(map(str, missing))
    files = tuple(int(n) for n in (array.shards or array.chunks))
    ranges = [
        (name, i * n, min((i + 1) * n, size) - 1)
        for name, i, n, size in zip(names, missing, files, array.shape, strict=True)
    ]
    where = ", ".join(f"{n} {a}" if a == b else f"{n} {a}-{b}" for n, a, b in ranges)
    raise _error(
        source,
        variable,
        f"{math.prod(grid) - within} of its {math.prod(grid)} chunk files are missing, the "
        f"first {key!r} ({where}): it would be read as the fill value; restore the store from "
        "a copy or regenerate it (a store written with write_empty_chunks=False leaves out "
        "chunks that hold only the fill value: rewrite it with write_empty_chunks=True)",
    )


def _available_memory() -> int:
    """Bytes of memory available on this machine (Linux: ``SC_AVPHYS_PAGES``; else the
    physical memory)."""
    page = os.sysconf("SC_PAGE_SIZE")
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return int(os.sysconf(name)) * int(page)
        except (ValueError, OSError):
            continue
    return 2**40


#: how a trajectory store is opened (the engine's block tasks open it the same way)
OPEN_OPTIONS: dict[str, Any] = {
    "consolidated": False,
    "decode_times": False,
    "decode_timedelta": False,
    "create_default_indexes": False,  # no index: the time coordinate is not loaded
}


def open_store_dataset(source: str, variable: str) -> xr.Dataset:
    """The zarr store at ``source`` (an absolute path or URL) as a lazy Dataset whose
    ``variable`` reads through :class:`ChunkReader`; refused with a :class:`TrajectoryError`
    when it is not a readable, complete store."""
    if Path(source).is_file():  # a netCDF or HDF5 file, say: zarr stores are folders
        raise _error(
            source,
            variable,
            "a file, not a zarr store (a folder): open a netCDF/HDF5 file in Python, "
            "estimate_response(xarray.open_dataset(path)), or convert it once with "
            "xarray.open_dataset(path).to_zarr('traj.zarr')",
        )
    try:
        ds = xr.open_zarr(source, chunks={}, **OPEN_OPTIONS)
    except Exception as exc:  # zarr/xarray raise many types for "not a readable store"
        raise _error(
            source, variable, f"not a readable zarr store ({type(exc).__name__}: {exc})"
        ) from None
    if ds.attrs.get("complete") is False:
        raise _error(source, variable, _incomplete_message(source, ds.attrs))
    if variable in ds.data_vars:
        ds = _reads_named(ds, source, variable)
    return ds


def _reads_named(ds: xr.Dataset, source: str, variable: str) -> xr.Dataset:
    """``ds`` with ``variable``'s dask array reading through :class:`ChunkReader` (same chunks,
    same decoding): a chunk that cannot be read or decoded (truncated, zero-length, garbage, a
    checksum that does not match) is then a :class:`TrajectoryError` naming the store, the
    chunk and its time range, wherever the read runs."""
    import dask.array

    stored = ds[variable]
    reader = ChunkReader.of(source, variable)
    data = dask.array.from_array(
        reader,
        chunks=stored.data.chunks,
        name=f"read-{stored.data.name}",
        meta=np.empty((0,) * stored.ndim, dtype=stored.dtype),
        asarray=False,
        lock=False,
    )
    return ds.assign({variable: stored.copy(data=data)})


class ChunkReader:
    """A stored variable (lazily indexed, not loaded) that dask reads region by region; a
    region that fails to read is one :class:`TrajectoryError` line: store, variable, chain,
    time range, the stored chunk and the reason."""

    def __init__(
        self, data: xr.Variable, source: str, variable: str, frames: BloscFrames | None = None
    ) -> None:
        self.data, self.source, self.variable = data, source, variable
        self.shape, self.dtype, self.ndim = data.shape, data.dtype, data.ndim
        self.chunks = data.encoding.get("chunks") or data.shape
        self.frames = frames

    @classmethod
    def of(cls, source: str, variable: str) -> ChunkReader:
        """The reader of ``variable`` in the store at ``source`` (metadata only: no chunk)."""
        lazy = xr.open_dataset(source, engine="zarr", chunks=None, cache=False, **OPEN_OPTIONS)
        return cls(lazy[variable].variable, source, variable, BloscFrames.of(source, variable))

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        try:
            if self.frames is not None:
                self.frames.check(key, self.shape)
            return np.asarray(self.data[key].values)
        except Exception as exc:  # whatever the codecs raise: truncated, garbage, checksum
            raise _error(self.source, self.variable, self._where(key, exc)) from None

    def _where(self, key: tuple[slice, ...], exc: Exception) -> str:
        region = {
            dim: (range(n)[k], chunk)
            for dim, n, k, chunk in zip(self.data.dims, self.shape, key, self.chunks, strict=True)
        }
        parts = []
        if "chain" in region:
            parts.append(f"chain {region['chain'][0].start}")
        if "time" in region:
            rows, chunk = region["time"]
            parts.append(f"time {rows.start}-{rows.stop - 1} (stored chunk {rows.start // chunk})")
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        advice = (
            "; rewrite the store with a checksum (crc32c, as kelr simulate writes) so that any "
            "damage fails its read"
            if isinstance(exc, TruncatedFrame)
            else ""
        )
        return (
            f"a damaged chunk at {', '.join(parts) or 'an unknown position'} cannot be read "
            f"({reason}); restore the store from a copy or regenerate it{advice}"
        )


class TruncatedFrame(ValueError):
    """A Blosc chunk file shorter than its own header says."""


@dataclass(frozen=True)
class BloscFrames:
    """The chunk files of a local store's variable compressed by Blosc with no checksum after
    it, checked against their own header before they are decoded: Blosc decodes a truncated
    frame past its end (a crash of the whole process, about one read in four), and nothing
    else catches the damage. Plain data (a path and the key format): pickled to workers."""

    directory: str
    chunks: tuple[int, ...]
    separator: str
    lead: str

    #: a Blosc frame's header: its compressed size, header included, is bytes 12-16
    HEADER = 16

    @classmethod
    def of(cls, source: str, variable: str) -> BloscFrames | None:
        """The check for ``variable`` in the store at ``source``; None unless it is a local,
        unsharded store whose outermost codec is Blosc (a checksum after Blosc already
        catches a truncated frame)."""
        if "://" in source:
            return None
        try:
            array = zarr.open_array(source, path=variable, mode="r", use_consolidated=False)
        except Exception:  # not a zarr array: the read names the problem
            return None
        metadata = array.metadata
        if isinstance(metadata, ArrayV3Metadata):
            names = [str(codec.to_dict().get("name", "")) for codec in metadata.codecs]
            outermost = names[-1] if names else ""
        else:
            compressor = getattr(metadata, "compressor", None)
            outermost = str(getattr(compressor, "codec_id", ""))
        if outermost != "blosc" or array.shards is not None:
            return None
        separator, lead = _key_format(array)
        directory = os.path.join(source, *array.path.split("/"))
        return cls(directory, tuple(int(c) for c in array.chunks), separator, lead)

    def check(self, key: tuple[slice, ...], shape: tuple[int, ...]) -> None:
        """Raise :class:`TruncatedFrame` for the first chunk file under the region ``key`` of
        an array of ``shape`` that is shorter than its header says (a chunk not stored is
        left to the read: it is the fill value)."""
        spans = [
            range(r.start // c, (r.stop - 1) // c + 1) if len(r) else range(0)
            for r, c in zip(
                (range(n)[k] for n, k in zip(shape, key, strict=True)), self.chunks, strict=True
            )
        ]
        for index in itertools.product(*spans):
            name = self.lead + self.separator.join(map(str, index))
            path = os.path.join(self.directory, *name.split("/"))
            try:
                with open(path, "rb") as file:
                    head, size = file.read(self.HEADER), os.fstat(file.fileno()).st_size
            except FileNotFoundError:
                continue
            if len(head) < self.HEADER:
                raise TruncatedFrame(
                    f"chunk file {name!r} holds {size} bytes, fewer than a Blosc header's "
                    f"{self.HEADER}: truncated"
                )
            said = int.from_bytes(head[12:16], "little")
            if said > size:
                raise TruncatedFrame(
                    f"chunk file {name!r} holds {size} bytes, its Blosc header says {said}: "
                    "truncated"
                )


def as_trajectory(
    obj: xr.Dataset | xr.DataArray,
    variable: str = "x",
    *,
    source: str | None = None,
    dt: float | None = None,
) -> xr.DataArray:
    """Validate an opened ``Dataset`` (its ``variable``) or ``DataArray`` as a trajectory.

    Parameters
    ----------
    obj : the data; numpy-backed data are chunked (blocks of about 4 MiB along time).
    variable : the variable of a ``Dataset`` (a ``DataArray`` is used as it is).
    source : name of the store for messages and ``attrs["store"]`` (default: the zarr store
        the object was opened from, else ``"<in-memory>"``; an object opened from a netCDF or
        other non-zarr file is read through the object itself, loaded here unless dask-backed,
        and never reopened from its path).
    dt : the sample interval (a positive finite number) of data without their own ``time``
        coordinate or ``dt`` attribute; where they have one, it must agree.

    Returns
    -------
    xarray.DataArray
        as described in :func:`open_trajectory`.

    Raises
    ------
    TrajectoryError
        for, each with its own message: a missing variable (the variables present are
        listed); dims other than ``(time, component)`` / ``(chain, time, component)``; a
        dtype other than float32, float64 or an integer type (integers are converted to
        float64; bool is refused); fewer than 2 samples or no
        component; no time step, a non-uniform or non-increasing ``time`` coordinate, a ``dt``
        that is not a positive finite number or disagrees with the coordinate; duplicate
        component names; a chunk layout that makes a task read more than 256 MiB.

        The chunk rule: a task reads one time chunk of one chain with all components. So
        chunks split along ``component`` are merged and chunks spanning several chains are
        split, both lazily, as long as every stored chunk and every such per-chain block holds
        at most ``MAX_CHUNK_BYTES`` (256 MiB); a larger chunk (for instance the whole array in
        one time chunk) is rejected with the advice to rechunk the store along ``time``.
    """
    through_object = False
    if source is None:
        source, through_object = _object_source(obj)
    if isinstance(obj, xr.Dataset):
        if variable not in obj.data_vars:
            present = ", ".join(repr(v) for v in obj.data_vars) or "none"
            raise _error(source, variable, f"no such variable (variables present: {present})")
        da = obj[variable]
        attrs = {**obj.attrs, **da.attrs}
    elif isinstance(obj, xr.DataArray):
        da = obj
        variable = str(obj.name) if obj.name is not None else variable
        attrs = dict(obj.attrs)
    else:
        raise _error(source, variable, f"expected an xarray Dataset or DataArray, not {type(obj)}")

    if through_object and da.chunks is None:
        da = da.compute()  # read here once; the engine scatters the samples to the workers
    da = _standard_dims(da, source, variable)
    da = _real(da, source, variable)
    for dim, least in (("chain", 1), ("time", 2), ("component", 1)):
        if da.sizes[dim] < least:
            raise _error(
                source, variable, f"{da.sizes[dim]} entries along {dim!r}, at least {least} needed"
            )
    dt = _time_step(da, attrs, source, variable, dt)
    units = _time_units(da, attrs)
    da = _chunked(da, source, variable)
    da = _with_coords(da, source, variable)
    da.attrs = {**attrs, "dt": dt, "store": source}
    if units is not None:
        da.attrs["time_units"] = units[0]
    da.name = variable
    return da


def _object_source(obj: Any) -> tuple[str, bool]:
    """The name of an opened object's data for messages and ``attrs["store"]``, and whether it
    must be read through the object itself.

    A zarr store (a directory, or a URL) the object was opened from is named by its path, which
    the workers reopen. Any other file (netCDF, HDF5, GRIB, ...) is not a store the workers can
    open: its samples are read through the object (loaded here unless dask-backed, then by the
    object's own tasks), and its name says so, so that no worker reopens it as zarr.
    """
    path = getattr(obj, "encoding", {}).get("source")
    if path is None:
        return IN_MEMORY, False
    path = str(path)
    if "://" in path or Path(path).is_dir():
        return path, False
    return f"{path} (read through the xarray object)", True


def _standard_dims(da: xr.DataArray, source: str, variable: str) -> xr.DataArray:
    """Transpose to ``(chain, time, component)``, adding a length-1 chain to an array without
    one and, to a scalar trajectory (``(time,)`` or ``(chain, time)``), one component named
    after the variable."""
    accepted = ({"time", "component"}, set(DIMS), {"time"}, {"chain", "time"})
    if set(da.dims) not in accepted or len(da.dims) != len(set(da.dims)):
        raise _error(
            source,
            variable,
            f"dims {tuple(da.dims)} found, expected ('time', 'component') or {DIMS} (or, for "
            "one component, ('time',) or ('chain', 'time'); or a field: a 'time' dim (or one "
            "of dates) and grid dims, e.g. ('time', 'lat', 'lon'))",
        )
    if "component" not in da.dims:
        da = da.expand_dims(component=[variable], axis=-1)
    if "chain" not in da.dims:
        da = da.expand_dims("chain")
    return da.transpose(*DIMS)


def _real(da: xr.DataArray, source: str, variable: str) -> xr.DataArray:
    """float32/float64 data as they are; integers (signed or not) converted to float64 (lazily
    for a store); booleans and anything else refused, naming the dtype."""
    if np.issubdtype(da.dtype, np.floating) and da.dtype.itemsize in (4, 8):
        return da
    if np.issubdtype(da.dtype, np.integer):
        return da.astype(np.float64)
    if da.dtype == np.bool_:
        raise _error(
            source,
            variable,
            "dtype bool: true/false values are not a trajectory (convert them to float "
            "yourself if they are meant as 0 and 1)",
        )
    raise _error(
        source,
        variable,
        f"dtype {da.dtype} is not a real number type (float32, float64 or an integer type)",
    )


def _time_step(
    da: xr.DataArray,
    attrs: Mapping[str, Any],
    source: str,
    variable: str,
    given: float | None = None,
) -> float:
    """The sample interval from the ``time`` coordinate and/or the ``dt`` attribute; ``given``
    (the caller's ``dt=``, a positive finite number: the options model checks it) is used when
    the data have neither and must agree with what they have otherwise."""
    from_coord, slack = (
        _coordinate_step(da, source, variable) if "time" in da.coords else (None, 0.0)
    )
    from_attr = None
    if "dt" in attrs:
        try:
            from_attr = float(attrs["dt"])
        except (TypeError, ValueError):
            raise _error(
                source, variable, f"dt attribute {attrs['dt']!r} is not a number"
            ) from None
        if not (math.isfinite(from_attr) and from_attr > 0):
            raise _error(source, variable, f"dt={from_attr:g} is not a positive finite number")
    if from_coord is None and from_attr is None:
        if given is not None:
            return float(given)
        raise _error(
            source,
            variable,
            "no time step: give a numeric 'time' coordinate or a 'dt' attribute (or dt= to "
            "estimate_response)",
        )
    own = from_attr if from_attr is not None else from_coord
    if given is not None and abs(given - own) > DT_RTOL * own + slack:  # type: ignore[operator]
        where = "dt attribute" if from_attr is not None else "time coordinate"
        raise _error(
            source,
            variable,
            f"dt={given:.10g} given, but the data's {where} says {own:.10g}; leave dt out (or "
            "correct the data)",
        )
    if from_coord is not None and from_attr is not None:
        if abs(from_coord - from_attr) > DT_RTOL * from_attr + slack:
            raise _error(
                source,
                variable,
                f"the time coordinate's step {from_coord:.10g} disagrees with dt={from_attr:.10g}",
            )
    return from_attr if from_attr is not None else from_coord  # type: ignore[return-value]


def _is_clock(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.datetime64) or np.issubdtype(dtype, np.timedelta64)


def _time_units(da: xr.DataArray, attrs: Mapping[str, Any]) -> tuple[str, str] | None:
    """The unit of ``dt`` and where it was found: ``"s"`` for a datetime64/timedelta64 ``time``
    coordinate (its step is taken in seconds), else the ``units`` attribute of a numeric
    ``time`` coordinate (the CF/xarray convention), else a ``time_units`` attribute; None when
    nothing says. On a validated trajectory (which carries the unit as ``time_units``) it finds
    the same unit from the same source."""
    time = da.coords.get("time")
    if time is not None and np.issubdtype(time.dtype, np.datetime64):
        return "s", "from datetime coordinates"
    if time is not None and np.issubdtype(time.dtype, np.timedelta64):
        return "s", "from timedelta coordinates"
    found = [
        (time.attrs.get("units") if time is not None else None, "from the time coordinate's units"),
        (attrs.get("time_units"), "from the time_units attribute"),
    ]
    for units, where in found:
        if isinstance(units, str) and units.strip():
            return units.strip(), where
    return None


def _coordinate_step(da: xr.DataArray, source: str, variable: str) -> tuple[float, float]:
    """The step of a ``time`` coordinate (float64 of its first and last entries) and how far it
    may be off through the coordinate's rounding; the coordinate is checked to be uniform to
    within ``DT_RTOL`` plus the rounding of its own dtype (:func:`_rounding`)."""
    time = da.coords["time"]
    clock = _is_clock(time.dtype)
    if time.dims != ("time",) or not (clock or np.issubdtype(time.dtype, np.number)):
        raise _error(
            source,
            variable,
            f"the time coordinate must be numeric, datetime64 or timedelta64 along 'time' "
            f"(found dims {time.dims}, dtype {time.dtype})",
        )
    t = time.data  # numpy, or dask for a store's coordinate (never loaded whole)
    if clock:
        t = _seconds_since_first(t)
    n = t.shape[0]
    first, last = _entries(t, [0, n - 1])
    dt = float((last - first) / (n - 1))
    if not (math.isfinite(dt) and dt > 0):
        raise _error(
            source,
            variable,
            f"dt={dt:g} from the time coordinate is not a positive "
            "finite number (the time coordinate must increase)",
        )
    rounding = _rounding(t.dtype, dt, max(abs(first), abs(last)), source, variable)
    tolerance = DT_RTOL * dt + rounding
    if isinstance(t, np.ndarray) or n <= TIME_CHECK_ROWS:
        _check_uniform(t, dt, tolerance, source, variable)
    else:
        rows = t.chunks[0]
        for part in (t[: rows[0]], t[n - rows[-1] :]):  # the first and the last chunk in full
            _check_uniform(part, dt, tolerance, source, variable)
    # the steps may each be within rounding of dt and still drift (float32 times accumulated
    # step by step: 0.05 added to ~1e4 rounds to 51 ulps every time), so entries are also
    # compared with the line through the first and the last, to within DT_RTOL of their span
    probes = np.unique(np.linspace(0, n - 1, TIME_PROBES).astype(np.int64))
    found = _entries(t, probes.tolist())
    expected = first + probes * dt
    off = np.abs(found - expected) - DT_RTOL * probes * dt - rounding
    worst = int(np.argmax(off))
    if off[worst] > 0:
        accumulated = (
            "; float32 times accumulated step by step drift like this: store float64 times or "
            "a 'dt' attribute"
            if t.dtype == np.float32
            else ""
        )
        raise _error(
            source,
            variable,
            f"time step is not uniform: time[{probes[worst]}] = {found[worst]:.10g}, but "
            f"time[0] + {probes[worst]} * dt = {expected[worst]:.10g} (dt from the first and "
            f"the last entry){accumulated}",
        )
    return dt, rounding / (n - 1)


def _seconds_since_first(t: Any) -> Any:
    """A datetime64 or timedelta64 coordinate (numpy or dask, kept lazy) as float64 seconds
    since its first entry: the time step of dates and durations is in seconds."""
    unit = "datetime64[ns]" if np.issubdtype(t.dtype, np.datetime64) else "timedelta64[ns]"
    ns = t.astype(unit).astype(np.int64)
    return (ns - ns[:1]).astype(np.float64) * 1e-9


def _rounding(dtype: np.dtype, dt: float, largest: float, source: str, variable: str) -> float:
    """How far a step (or an entry from ``time[0] + i dt``) of a uniform time coordinate may be
    off through rounding: a few roundings of the coordinate's dtype at its largest magnitude
    ``largest`` (a float32 coordinate holds ``0.05 * i`` only to about 1e-7 of the time; integers
    are read as float64). A coordinate
    whose rounding is more than half a step cannot show its step at all: it is refused, with
    the fix (float64 times, or a ``dt`` attribute instead of the coordinate).
    """
    eps = np.finfo(dtype).eps if np.issubdtype(dtype, np.floating) else np.finfo(np.float64).eps
    rounding = 4 * float(eps) * largest  # each entry rounded, the steps computed in float64
    if rounding > dt / 2:
        raise _error(
            source,
            variable,
            f"the {dtype} time coordinate is too coarse for its step dt={dt:g}: at times up to "
            f"{largest:g} it is rounded to about {rounding / 4:g}; store the time as float64, or "
            "drop the coordinate and give a 'dt' attribute",
        )
    return rounding


def _entries(t: Any, indices: list[int]) -> np.ndarray:
    """``t[indices]`` as float64, reading only the chunks that hold them (dask or numpy)."""
    picked = t[np.asarray(indices)]
    if not isinstance(picked, np.ndarray):
        picked = picked.compute(scheduler="synchronous")
    return np.asarray(picked, dtype=np.float64)


def _check_uniform(t: Any, dt: float, tolerance: float, source: str, variable: str) -> None:
    """An error unless every step of ``t`` is ``dt`` to within ``tolerance``."""
    low, high = _step_range(t)
    if max(abs(low - dt), abs(high - dt)) > tolerance:
        raise _error(
            source,
            variable,
            f"time step is not uniform (dt varies from {low:g} to {high:g}, more than the "
            f"{t.dtype} coordinate's rounding allows)",
        )


def _step_range(t: Any) -> tuple[float, float]:
    """Smallest and largest step of ``t`` (streamed chunk by chunk when it is dask)."""
    if isinstance(t, np.ndarray):
        steps = np.diff(np.asarray(t, dtype=np.float64))
        return float(steps.min()), float(steps.max())
    import dask
    import dask.array

    steps = dask.array.diff(t.astype(np.float64))
    low, high = dask.compute(steps.min(), steps.max(), scheduler="synchronous")
    return float(low), float(high)


def _chunked(da: xr.DataArray, source: str, variable: str) -> xr.DataArray:
    """Blocks of one chain, all components, time chunks as stored (see ``as_trajectory``)."""
    itemsize = da.dtype.itemsize
    n_chains, _, n_comp = da.shape
    if da.chunks is None:
        rows = max(1, DEFAULT_BLOCK_BYTES // (itemsize * n_comp))
        return da.chunk({"chain": 1, "time": rows, "component": -1})
    chain_chunks, time_chunks, comp_chunks = da.chunks
    stored = max(chain_chunks) * max(time_chunks) * max(comp_chunks) * itemsize
    block = max(time_chunks) * n_comp * itemsize
    if max(stored, block) > MAX_CHUNK_BYTES:
        shape = (max(chain_chunks), max(time_chunks), max(comp_chunks))
        rows = MAX_CHUNK_BYTES // (itemsize * n_comp * max(chain_chunks))
        raise _error(
            source,
            variable,
            f"chunks of up to {shape} (chain, time, component) make a task read "
            f"{_human_bytes(max(stored, block))}, more than the "
            f"{_human_bytes(MAX_CHUNK_BYTES)} limit; rechunk the store along 'time' "
            f"(at most {rows} samples per chunk, one chain per chunk)",
        )
    if len(chain_chunks) != n_chains or len(comp_chunks) != 1:
        da = da.chunk({"chain": 1, "component": -1})
    return da


def _with_coords(da: xr.DataArray, source: str, variable: str) -> xr.DataArray:
    """Plain-string component names (``x1, x2, ...`` when absent) and a chain coordinate."""
    n_comp = da.sizes["component"]
    if "component" in da.coords:
        names = np.asarray([str(v) for v in da.coords["component"].values], dtype=str)
    else:
        names = np.asarray([f"x{i + 1}" for i in range(n_comp)], dtype=str)
    if len(set(names.tolist())) != n_comp:
        raise _error(source, variable, f"component names {names.tolist()} are not unique")
    da = da.assign_coords(component=names)
    if "chain" not in da.coords:
        da = da.assign_coords(chain=np.arange(da.sizes["chain"]))
    return da


def estimate_limits(n: int, d: int) -> list[str]:
    """Why a trajectory of ``n`` samples per chain and ``d`` components cannot be estimated
    (``MIN_SAMPLES``, ``MAX_COMPONENTS``); empty when it can."""
    problems = []
    if d > MAX_COMPONENTS:
        transposed = " (more components than samples: is the array transposed?)" if d >= n else ""
        problems.append(
            f"{d} components{transposed}; at most {MAX_COMPONENTS} are supported (the response "
            "is d² lagged sums per lag, with as many again per held-out fold for its error "
            "bars); select the components to estimate with --components NAMES (components= in "
            "Python, input.components in a job file)"
        )
    if n < MIN_SAMPLES:
        problems.append(
            f"{n} samples per chain; the estimate needs at least {MIN_SAMPLES} (orders, "
            "held-out folds and error bars)"
        )
    return problems


def checksums(path: str, variable: str) -> str | None:
    """The checksum codec of the zarr store ``path``'s ``variable`` (``"crc32c"``), or None
    when its chunks carry none (or it is not a local zarr array)."""
    try:
        metadata = zarr.open_array(path, path=variable, mode="r").metadata
    except Exception:  # not a zarr array
        return None
    if not isinstance(metadata, ArrayV3Metadata):  # zarr 2: no checksums this package can name
        return None
    outer = metadata.codecs
    codecs = [*outer, *(c for codec in outer for c in getattr(codec, "codecs", ()))]
    names = [str(codec.to_dict().get("name", "")) for codec in codecs]  # and inside a shard
    return "crc32c" if "crc32c" in names else None


def parse_json_attr(text: str, name: str = "attribute") -> Any:
    """The JSON text of an attribute (``model_params``, an order) parsed, refusing documents
    nested deeper than ``MAX_JSON_DEPTH`` before parsing them (Python's parser would recurse
    out of its stack on a few thousand levels; the nesting is counted in one linear scan).

    Raises
    ------
    ValueError
        invalid JSON, or nested too deep (the message names ``name``).
    """
    depth = deepest = 0
    quoted = escaped = False
    for char in text:
        if quoted:
            escaped, quoted = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                raise ValueError(
                    f"{name}: JSON nested deeper than {MAX_JSON_DEPTH} levels ({len(text)} "
                    "characters), not read"
                )
        elif char in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{name}: not valid JSON ({err})") from None


def cut_attr(value: Any, limit: int = MAX_ATTR_CHARS) -> Any:
    """A provenance attribute as results keep and commands show it: a text longer than
    ``limit`` characters cut to ``limit``, with how long it was (a store's attributes can be
    of any size); anything else as it is."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... (cut: {len(value)} characters)"
    return value


def describe_trajectory(da: xr.DataArray) -> dict[str, Any]:
    """A summary of a validated trajectory (from :func:`open_trajectory`) for ``kelr info``.

    Returns
    -------
    dict with ``store``, ``variable``, ``dims``, ``chains``, ``length`` (samples per chain),
    ``dt``, ``duration`` (``(length - 1) * dt``), ``time_units`` (the unit of both, None when
    the store does not say) and ``time_units_source`` (where it was found), ``components``,
    ``dtype``, ``time_chunk`` (largest time chunk), ``n_blocks`` (chain x time blocks),
    ``bytes`` and ``origin`` (the provenance attributes present, ``model_params`` decoded from
    JSON), ``limits`` (``estimate_limits``: why ``kelr estimate`` would refuse it; empty
    when it would not).
    """
    origin = {k: da.attrs[k] for k in PROVENANCE_ATTRS if k in da.attrs}
    origin.update({k: cut_attr(v) for k, v in origin.items() if k != "model_params"})
    if isinstance(origin.get("model_params"), str):
        try:
            origin["model_params"] = parse_json_attr(origin["model_params"], "model_params")
        except ValueError as err:  # an arbitrary user attribute: shown as it is, or why not
            text = origin["model_params"]
            origin["model_params"] = str(err) if len(text) > MAX_ATTR_CHARS else text
    time_chunks = da.chunks[1] if da.chunks is not None else (da.sizes["time"],)
    n_blocks = (len(da.chunks[0]) if da.chunks is not None else 1) * len(time_chunks)
    return {
        "store": da.attrs.get("store"),
        "variable": da.name,
        "dims": tuple(da.dims),
        "chains": da.sizes["chain"],
        "length": da.sizes["time"],
        "dt": da.attrs["dt"],
        "duration": (da.sizes["time"] - 1) * da.attrs["dt"],
        "time_units": units[0] if (units := _time_units(da, da.attrs)) else None,
        "time_units_source": units[1] if units else None,
        "components": [str(c) for c in da.coords["component"].values],
        "dtype": str(da.dtype),
        "time_chunk": max(time_chunks),
        "n_blocks": n_blocks,
        "bytes": int(da.nbytes),
        "origin": origin,
        "limits": estimate_limits(da.sizes["time"], da.sizes["component"]),
    }


def read_progress(path: str | os.PathLike[str]) -> np.ndarray:
    """All chains' progress records, ``(chains, progress_width)`` uint64 (zero: none yet)."""
    array = zarr.open_array(os.fspath(path), path=f"{PROGRESS_GROUP}/{PROGRESS_ARRAY}", mode="r")
    return np.asarray(array[...])


def _incomplete_message(source: str, attrs: Mapping[str, Any]) -> str:
    try:
        written = read_progress(source)[:, 0]
        done = f"{int(written.min())} to {int(written.max())}"
    except Exception:  # the hint must not fail on a damaged progress record
        done = "an unknown number"
    params = attrs.get("model_params", "{}")
    return (
        f"incomplete generated store ({done} of {attrs.get('n_samples')} samples per chain "
        f"written); resume it by calling kelr_dist.models.simulate.simulate(make_model("
        f"{attrs.get('model')!r}, **{params}), {source!r}, n_samples={attrs.get('n_samples')}, "
        f"chains={attrs.get('chains')}, seed={attrs.get('seed')}, chunk={attrs.get('chunk')}, "
        f"burn_in={attrs.get('burn_in')}) again"
    )
