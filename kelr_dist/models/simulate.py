"""Chunked, resumable, reproducible generation of trajectory stores from the test models.

Each chain is simulated and written one time chunk after another (memory bounded by one
chunk), continuing exactly from its last state and random stream. Chain ``c`` draws from
``Generator(PCG64(SeedSequence(seed).spawn(chains)[c]))``, and the models' ``advance`` does not
depend on how a run is split (:mod:`kelr_dist.models.sampling`), so a store depends only on the
model, ``seed``, ``n_samples``, ``chains`` and ``burn_in``: not on the number of workers, nor on
interruptions.

After writing each chunk, a chain stores its progress record (samples written, the PCG64
state, the model state) in its own chunk of ``_progress/record`` (see
:func:`kelr_dist.data.writer.create_store`), after the samples, so a killed run loses at most the
chunk in flight and :func:`simulate` called again with the same arguments continues from the
records. Chains run as tasks on a Dask ``distributed.Client`` (one task per chunk, chained per
chain) or one after another in this process.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from kelr_dist import __version__
from kelr_dist.data.atomic import new_directory, replacement
from kelr_dist.data.store import open_trajectory, parse_json_attr, read_progress
from kelr_dist.data.writer import (
    create_store,
    mark_complete,
    read_attrs,
    write_progress,
    write_samples,
)
from kelr_dist.kernels.checks import is_whole
from kelr_dist.models.protocol import Model
from kelr_dist.models.registry import make_model

# progress record: [samples written, PCG64 state (hi, lo), inc (hi, lo), has_uint32,
#                   uinteger, model state as float64 bits (d)]
_RNG_WORDS = 6
_MASK64 = (1 << 64) - 1
# attributes that must match for a store to be resumed
_SETTINGS = ("model", "model_params", "seed", "burn_in", "n_samples", "chains", "chunk")


def _encode(done: int, state: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Progress record ``(1 + 6 + d,)`` uint64 of a chain."""
    st = rng.bit_generator.state
    words = [
        done,
        st["state"]["state"] >> 64,
        st["state"]["state"] & _MASK64,
        st["state"]["inc"] >> 64,
        st["state"]["inc"] & _MASK64,
        st["has_uint32"],
        st["uinteger"],
    ]
    state_bits = np.ascontiguousarray(state, dtype=np.float64).view(np.uint64)
    return np.concatenate([np.array(words, dtype=np.uint64), state_bits])


def _decode(record: np.ndarray) -> tuple[int, np.ndarray, np.random.Generator]:
    """Inverse of :func:`_encode`: ``(samples written, state (d,), generator)``."""
    w = [int(v) for v in record[: 1 + _RNG_WORDS]]
    bit_generator = np.random.PCG64()
    bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (w[1] << 64) | w[2], "inc": (w[3] << 64) | w[4]},
        "has_uint32": w[5],
        "uinteger": w[6],
    }
    state = np.array(record[1 + _RNG_WORDS :], dtype=np.uint64).view(np.float64)
    return w[0], state, np.random.Generator(bit_generator)


@dataclass(frozen=True)
class _Run:
    """Everything a chunk task needs (picklable; sent to the workers)."""

    path: str
    model: Model
    n_samples: int
    chains: int
    seed: int
    chunk: int
    burn_in: int

    def start(self, chain: int) -> tuple[np.ndarray, np.random.Generator]:
        """State and generator of ``chain`` after its burn-in (advanced chunk by chunk)."""
        child = np.random.SeedSequence(self.seed).spawn(self.chains)[chain]
        rng = np.random.Generator(np.random.PCG64(child))
        state = self.model.initial_state(rng)
        for begin in range(0, self.burn_in, self.chunk):
            _, state = self.model.advance(state, min(self.chunk, self.burn_in - begin), rng)
        return state, rng

    def step(self, chain: int, record: np.ndarray) -> tuple[int, np.ndarray]:
        """Simulate and write the next chunk of ``chain``; returns ``(chain, new record)``."""
        if record[0] == 0:
            done, (state, rng) = 0, self.start(chain)
        else:
            done, state, rng = _decode(record)
        samples, state = self.model.advance(state, min(self.chunk, self.n_samples - done), rng)
        write_samples(self.path, chain, done, samples)
        record = _encode(done + samples.shape[0], state, rng)
        write_progress(self.path, chain, record)
        return chain, record


def _positive_int(name: str, value: Any, least: int = 1) -> int:
    if not is_whole(value, least):
        raise ValueError(f"{name}={value!r} must be an integer >= {least}")
    return int(value)


def _resolve_model(model: Model | str) -> Model:
    if isinstance(model, str):
        return make_model(model)
    if not isinstance(model, Model):
        raise ValueError(f"model={model!r} is neither a model name nor a Model")
    return model


def _settings_mismatch(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Human-readable differences between a store's generation settings and the wanted ones."""
    differences = []
    for key in _SETTINGS:
        have, want = stored.get(key), wanted[key]
        if key == "model_params":
            have_p, want_p = parse_json_attr(have or "{}"), json.loads(want)
            for name in sorted(set(have_p) | set(want_p)):
                if have_p.get(name) != want_p.get(name):
                    differences.append(
                        f"model parameter {name!r}: store {have_p.get(name)!r}, "
                        f"given {want_p.get(name)!r}"
                    )
        elif have != want:
            differences.append(f"{key}: store {have!r}, given {want!r}")
    return differences


def _create(path: Path, run: _Run, settings: dict[str, Any], width: int) -> None:
    """An empty store for ``run`` at ``path`` (see :func:`kelr_dist.data.writer.create_store`)."""
    create_store(
        path,
        chains=run.chains,
        n_samples=run.n_samples,
        components=tuple(run.model.components),
        dt=float(run.model.dt),
        chunk=run.chunk,
        attrs={**settings, "kelr_dist_version": __version__, "bit_generator": "PCG64"},
        progress_width=width,
    )


def _is_replaceable(path: str) -> bool:
    """A zarr store (its ``zarr.json``) or an empty folder: what ``overwrite`` may replace.
    Anything else (a file, a folder of other things) is never deleted."""
    folder = Path(path)
    return folder.is_dir() and ((folder / "zarr.json").is_file() or not any(folder.iterdir()))


def _prepare(
    path: str, run: _Run, settings: dict[str, Any], overwrite: bool = False
) -> np.ndarray | None | Literal[True]:
    """Create the store, or check an existing one; progress records, ``None`` if complete,
    ``True`` when ``path`` is to be replaced by a new generation (``overwrite``)."""
    width = 1 + _RNG_WORDS + len(run.model.components)
    if not os.path.exists(path):
        # made in a temporary sibling and renamed: a full disk or a crash while creating
        # leaves no half-made store at ``path`` (which a later call could not resume)
        with new_directory(path) as fresh:
            _create(fresh, run, settings, width)
        return np.zeros((run.chains, width), dtype=np.uint64)
    stored = read_attrs(path)
    if stored is None or "complete" not in stored or "model_params" not in stored:
        if overwrite and _is_replaceable(path):
            return True
        if _is_replaceable(path):
            raise ValueError(
                f"path={path!r} exists and is not a store made by simulate; remove it, choose "
                "another path, or replace it with overwrite=True (kelr simulate --overwrite)"
            )
        raise ValueError(
            f"path={path!r} exists and is not a zarr store; refusing to overwrite it (remove "
            "it or choose another path; overwrite replaces only a zarr store or an empty folder)"
        )
    differences = _settings_mismatch(stored, settings)
    if differences:
        if overwrite:
            return True
        raise ValueError(
            f"path={path!r} holds a generation with other settings "
            f"({'; '.join(differences)}); choose another path, or replace it with "
            "overwrite=True (kelr simulate --overwrite)"
        )
    return None if stored["complete"] else read_progress(path)


def simulate(
    model: Model | str,
    path: str | os.PathLike[str],
    n_samples: int,
    chains: int = 1,
    seed: int = 0,
    chunk: int = 262144,
    client: Any = None,
    burn_in: int | None = None,
    progress: bool | None = None,
    overwrite: bool = False,
) -> xr.DataArray:
    """Simulate ``chains`` independent chains of ``model`` into the trajectory store ``path``.

    Parameters
    ----------
    model : a ``kelr_dist.models.protocol.Model`` or a name (one of ``MODEL_NAMES``)
        built with default parameters.
    path : where the zarr store is written; an incomplete store made by an earlier call with
        the same settings is resumed, a complete one is returned as it is.
    n_samples : samples per chain kept (after the model's subsampling and the burn-in).
    chains : independent chains; chain ``c`` uses ``SeedSequence(seed).spawn(chains)[c]``.
    seed : non-negative integer seed.
    chunk : samples per time chunk (of the store and of each task); memory per task is
        about ``chunk * d * 8`` bytes plus the model's scratch.
    client : a ``distributed.Client``: chains run in parallel as tasks on its workers
        (one task per chunk); ``None`` runs them one after another in this process. The
        store is the same either way.
    burn_in : samples discarded at the start of each chain (default
        ``model.default_burn_in``).
    progress : a progress bar over chunks written: ``None`` shows it on a terminal only,
        ``False`` never, ``True`` always.
    overwrite : replace an existing store at ``path`` made with other settings (or a zarr
        store not made by ``simulate``, or an empty folder). The new store is generated in a
        temporary sibling and put in place in one atomic step when it is complete, so ``path``
        holds the old store until then (an interrupted overwrite is not resumed: it starts
        again). A store with the same settings is resumed or returned as it is, as without
        ``overwrite``; a file or a folder that is not a zarr store is never replaced.

    Returns
    -------
    xarray.DataArray
        ``open_trajectory(path)``: dims ``(chain, time, component)``, shape
        ``(chains, n_samples, d)`` float64, ``attrs`` with ``dt``, ``model``,
        ``model_params`` (JSON), ``seed``, ``burn_in``, ``kelr_dist_version``.

    Raises
    ------
    ValueError
        naming the parameter: ``n_samples``, ``chains``, ``chunk`` < 1, ``burn_in`` or
        ``seed`` < 0, an unknown model, or (without ``overwrite``) an existing ``path`` that is
        not a store made by ``simulate`` with the same settings (the differences are listed).
    """
    model = _resolve_model(model)
    n_samples = _positive_int("n_samples", n_samples)
    chains = _positive_int("chains", chains)
    chunk = _positive_int("chunk", chunk)
    seed = _positive_int("seed", seed, least=0)
    burn_in = _positive_int(
        "burn_in", model.default_burn_in if burn_in is None else burn_in, least=0
    )
    path = os.fspath(path)
    settings = {
        "model": model.name,
        "model_params": json.dumps(model.params(), sort_keys=True),
        "seed": seed,
        "burn_in": burn_in,
        "n_samples": n_samples,
        "chains": chains,
        "chunk": chunk,
    }
    run = _Run(path, model, n_samples, chains, seed, chunk, burn_in)
    records = _prepare(path, run, settings, overwrite=bool(overwrite))
    if records is True:  # overwrite: a new generation in a sibling, swapped in when complete
        with replacement(path) as fresh:
            run = _Run(os.fspath(fresh), model, n_samples, chains, seed, chunk, burn_in)
            width = 1 + _RNG_WORDS + len(model.components)
            _create(fresh, run, settings, width)
            _generate(run, np.zeros((chains, width), dtype=np.uint64), client, progress)
    elif records is not None:
        _generate(run, records, client, progress)
    return open_trajectory(path)


def _generate(run: _Run, records: np.ndarray, client: Any, progress: bool | None) -> None:
    """Write every chunk not yet written (per ``records``), then mark the store complete."""
    n_chunks = math.ceil(run.n_samples / run.chunk)
    done_chunks = sum(math.ceil(int(r[0]) / run.chunk) for r in records)
    with tqdm(
        total=run.chains * n_chunks,
        initial=done_chunks,
        unit="chunk",
        desc=f"simulate {run.model.name}",
        disable=None if progress is None else not progress,
    ) as bar:
        if client is None:
            _run_here(run, records, bar)
        else:
            _run_on_client(client, run, records, bar)
    mark_complete(run.path)


def _run_here(run: _Run, records: np.ndarray, bar: tqdm) -> None:
    for chain, record in enumerate(records):
        while record[0] < run.n_samples:
            _, record = run.step(chain, record)
            bar.update()


def _run_on_client(client: Any, run: _Run, records: np.ndarray, bar: tqdm) -> None:
    """Chains in parallel: each finished chunk task submits the next chunk of its chain."""
    from distributed import as_completed

    pending = as_completed(
        [
            client.submit(run.step, chain, record, pure=False)
            for chain, record in enumerate(records)
            if record[0] < run.n_samples
        ],
        loop=client.loop,  # the given client, not a default one
    )
    for future in pending:
        chain, record = future.result()
        bar.update()
        if record[0] < run.n_samples:
            pending.add(client.submit(run.step, chain, record, pure=False))
