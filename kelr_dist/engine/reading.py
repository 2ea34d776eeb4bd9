"""Row ranges of a trajectory store, read inside the task that reduces them.

A store opened by :func:`kelr_dist.data.store.open_trajectory` is a dask array with one load
task per stored chunk: a store of 1e10 samples in 4096-row chunks would be millions of tasks
per pass. When a trajectory is exactly such a store (:func:`store_rows`), each block task of a
pass reads its own rows with :meth:`StoreRows.read`: xarray's lazy indexing of the store, which
decodes only the stored chunks that hold those rows. A pass is then one task per block whatever
the store's chunking, and each stored chunk is decoded once (the rows a halo needs from the
next block come from that block's task, :class:`kelr_dist.engine.graph.Stitched`).

The identity check is dask's own naming: a dask array's name is a hash of the graph that makes
it, so a trajectory is the store as ``open_trajectory`` opens it when its name is the name the
same open gives now (the store's metadata are read, no chunk; a changed store, or any selection
or arithmetic on the trajectory, gives another name and the pass reads the trajectory's own
chunks instead).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import dask
import numpy as np
import xarray as xr

from kelr_dist.data.store import IN_MEMORY, ChunkReader

#: the dims a store's variable may have, as ``open_trajectory`` accepts them
TIME_COMPONENT = ("time", "component")


@dataclass(frozen=True)
class StoreRows:
    """Reads rows of one chain of a trajectory store (picklable: store path and variable)."""

    store: str
    variable: str
    name: str  # the trajectory's dask name: a new store at the same path is opened anew

    def read(self, chain: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of chain ``chain``, shape ``(stop - start, d)``, as stored
        (decoded as xarray decodes the store; a chunk that cannot be decoded is named as
        :class:`~kelr_dist.data.store.ChunkReader` names it)."""
        reader = _reader(self.store, self.variable, self.name)
        dims = list(reader.data.dims)
        step = int(reader.chunks[dims.index("time")])
        edges = [start, *range((start // step + 1) * step, stop, step), stop]

        def rows_of(lo: int, hi: int) -> np.ndarray:
            return reader[
                tuple(
                    slice(chain, chain + 1) if dim == "chain" else
                    slice(lo, hi) if dim == "time" else slice(None)
                    for dim in dims
                )
            ]  # fmt: skip

        # one stored chunk at a time: a chunk that fails to decode is named with its own rows,
        # and leaves no concurrent reads of its neighbours pending (zarr's event loop reports
        # each of them on stderr)
        pieces = [rows_of(lo, hi) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
        # views where they do: a block within one stored chunk, stored as (chain, time,
        # component), is the decoded chunk itself (each copy of a pass's rows costs as much as
        # a cheap kernel)
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=dims.index("time"))
        if "chain" in dims:
            rows = rows[tuple(0 if d == "chain" else slice(None) for d in dims)]
            dims.remove("chain")
        order = [dims.index(d) for d in TIME_COMPONENT if d in dims]
        return np.transpose(rows, order).reshape(stop - start, -1)


@functools.lru_cache(maxsize=8)
def _reader(store: str, variable: str, name: str) -> ChunkReader:  # noqa: ARG001 (cache key)
    """The store's variable, lazily indexed (no chunk read), opened once per worker process
    and trajectory (``name``: a new store at the same path is opened anew)."""
    return ChunkReader.of(store, variable)


def store_rows(trajectory: xr.DataArray) -> StoreRows | None:
    """A reader of ``trajectory``'s store when ``trajectory`` is that store as
    :func:`kelr_dist.data.store.open_trajectory` opens it (same dask name), else ``None``."""
    store = trajectory.attrs.get("store")
    name = getattr(trajectory.data, "name", None)
    if not isinstance(store, str) or store == IN_MEMORY or name is None:
        return None
    variable = str(trajectory.name) if trajectory.name is not None else "x"
    dt = float(trajectory.attrs.get("dt", 1.0))
    return StoreRows(store, variable, name) if _opens_as(store, variable, dt, name) else None


@functools.lru_cache(maxsize=64)
def _opens_as(store: str, variable: str, dt: float, name: str) -> bool:
    """Whether opening ``store`` as a trajectory gives a dask array named ``name`` (asked once
    per process: the name fixes the store's shape, chunks and dtype as opened)."""
    from kelr_dist.data.store import as_trajectory, open_store_dataset

    try:  # coordinates read here, in this process, never on a cluster that may be stuck
        with dask.config.set(scheduler="synchronous"):
            raw = open_store_dataset(store, variable)
            # the time coordinate is left out: its checks would read it, and the data's dask
            # name does not depend on it
            again = as_trajectory(
                raw.drop_vars("time", errors="ignore"), variable, source=store, dt=dt
            )
    except Exception:  # not a store this process can open as a trajectory: read the chunks
        return False
    return again.data.name == name
