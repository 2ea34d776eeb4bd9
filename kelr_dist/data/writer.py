"""The generated-store writer the simulator uses: create, fill by chain, record progress, finish.

One process creates a pre-sized ``(chain, time, component)`` array and its metadata
(:func:`create_store`); workers then write disjoint, chunk-aligned regions (one chain each, no
sharding, :func:`write_samples`) and a per-chain progress record (:func:`write_progress`, one
zarr chunk per chain, so concurrent chains never touch the same object); only the creating
process changes metadata, once at the end (:func:`mark_complete`, the ``complete`` attribute,
then the consolidated metadata).
The layout is the one :mod:`kelr_dist.data.store` reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from kelr_dist.data.atomic import consolidated_metadata
from kelr_dist.data.store import DIMS, PROGRESS_ARRAY, PROGRESS_GROUP

#: the stores' compressor: sampled trajectories are floats whose low mantissa bits are noise, so
#: no codec saves much room (zstd with bit-shuffle 12%, lz4 with byte-shuffle 9%), while every
#: pass of an estimate decodes the whole store; lz4 decodes a chunk about twice as fast (see
#: docs/benchmarks.md, section 'Tuning constants')
COMPRESSOR = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def create_store(
    path: str | os.PathLike[str],
    *,
    chains: int,
    n_samples: int,
    components: tuple[str, ...],
    dt: float,
    chunk: int,
    attrs: Mapping[str, Any],
    progress_width: int,
    variable: str = "x",
    dtype: str = "float64",
) -> None:
    """Create an empty, pre-sized generated store (metadata only; call from one process).

    Layout: ``variable`` ``(chain, time, component)`` of ``dtype`` (NaN until written),
    chunks ``(1, chunk, d)``, compressed with :data:`COMPRESSOR` and a crc32c checksum of each
    chunk (zarr 3's ``crc32c`` codec: a damaged chunk file fails to decode instead of reading as
    other numbers), not sharded, ``dt`` in its attributes;
    ``chain`` and ``component`` coordinates; ``attrs`` plus ``complete=False`` on the root
    group; and ``_progress/record``, ``(chains, progress_width)`` uint64 with one chunk per
    chain, zero until a chain records its progress; a record's first entry is the number of
    samples the chain has written (the rest is the writer's business). Fails if ``path``
    exists.
    """
    root = zarr.open_group(
        os.fspath(path), mode="w-", zarr_format=3, attributes={**attrs, "complete": False}
    )
    root.create_array(
        variable,
        shape=(chains, n_samples, len(components)),
        chunks=(1, chunk, len(components)),
        dtype=dtype,
        fill_value=np.nan,
        # the checksum covers the compressed bytes: any damage to a chunk file fails its read
        compressors=(COMPRESSOR, Crc32cCodec()),
        dimension_names=DIMS,
        attributes={"dt": dt},
    )
    root.create_array(
        "component", shape=(len(components),), dtype=str, dimension_names=("component",)
    )[:] = np.asarray(components, dtype=str)
    root.create_array("chain", shape=(chains,), dtype="int64", dimension_names=("chain",))[:] = (
        np.arange(chains)
    )
    root.create_group(PROGRESS_GROUP).create_array(
        PROGRESS_ARRAY,
        shape=(chains, progress_width),
        chunks=(1, progress_width),
        dtype="uint64",
        fill_value=0,
    )


def write_samples(
    path: str | os.PathLike[str], chain: int, start: int, samples: np.ndarray, variable: str = "x"
) -> None:
    """Write ``samples (L, d)`` to rows ``[start, start + L)`` of ``chain``.

    ``start`` must be a multiple of the time chunk and ``L`` the chunk (or what is left), so
    that concurrent writers never share a chunk.
    """
    array = zarr.open_array(os.fspath(path), path=variable, mode="r+")
    array[chain, start : start + samples.shape[0], :] = samples


def write_progress(path: str | os.PathLike[str], chain: int, record: np.ndarray) -> None:
    """Store the progress ``record (progress_width,)`` uint64 of ``chain`` (one chunk, atomic
    on a local store: zarr writes a chunk to a temporary file and renames it)."""
    array = zarr.open_array(os.fspath(path), path=f"{PROGRESS_GROUP}/{PROGRESS_ARRAY}", mode="r+")
    array[chain, :] = record


def read_attrs(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The root attributes of the zarr store at ``path``, or ``None`` when there is none."""
    try:
        return dict(zarr.open_group(os.fspath(path), mode="r").attrs)
    except (FileNotFoundError, zarr.errors.NodeNotFoundError, zarr.errors.NodeTypeValidationError):
        return None


def mark_complete(path: str | os.PathLike[str]) -> None:
    """Set the root attribute ``complete=True`` and consolidate the metadata (from the one
    process that created the store, once every chain is written: nothing changes the metadata
    afterwards, so ``xarray.open_zarr`` reads the consolidated copy without a warning)."""
    zarr.open_group(os.fspath(path), mode="r+").attrs["complete"] = True
    with consolidated_metadata():
        zarr.consolidate_metadata(os.fspath(path))
