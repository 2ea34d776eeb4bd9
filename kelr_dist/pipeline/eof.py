"""The EOF route (``reduce="eof(k)"``): an estimate on the leading EOFs, lifted back.

A field with many components is estimated on its leading principal components and the response
lifted back to the components.

Three steps around the ordinary estimate (:func:`kelr_dist.pipeline.estimate.estimate_response`):

1. :func:`fit_eofs`, one pass: the mergeable mean and covariance sums
   (:func:`kelr_dist.kernels.baselines.quasi_gaussian.mean_covariance_reduction`; the samples are
   never gathered), and their leading ``k`` eigenvectors (:mod:`kelr_dist.kernels.bases.eof`);
2. :func:`project_trajectory`: the amplitudes ``y = Vᵀ (x - x̄)``, lazily, block by block, on
   which every later pass of the estimate runs (components ``eof1..eofk``);
3. :func:`lift_result`: every response-shaped variable of the amplitudes' result lifted back as
   ``V k_y Vᵀ`` (standard errors as the bound ``|V| σ |V|ᵀ``), the amplitudes' own kept beside
   it with the prefix ``eof_``.

The lifted response is the response of the projected dynamics: the amplitudes' own score, with
the other modes treated as part of the noise. It is the full system's response only when the
EOF subspace is invariant under the dynamics (and then only within it: at lag 0 it is the
projector ``V Vᵀ``, not the identity).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import dask.array as da
import numpy as np
import xarray as xr

from kelr_dist.kernels.baselines.quasi_gaussian import mean_covariance_reduction
from kelr_dist.kernels.bases.eof import Eofs, eof_names, leading_eofs, lift, lift_bound
from kelr_dist.pipeline.options import eof_modes

if TYPE_CHECKING:
    from kelr_dist.pipeline.inputs import Inputs
    from kelr_dist.pipeline.steps import Passes

#: the attribute a lifted result's readers are pointed to
RESPONSE_OF = (
    "the projected dynamics: the response of the leading EOF amplitudes to forcings on them, "
    "lifted back to the components as V k V^T (at lag 0 the projector V V^T onto the EOFs); "
    "the full system's response only where the EOF subspace is invariant under the dynamics"
)


def fit_eofs(passes: Passes, k: int) -> Eofs:
    """The leading ``k`` EOFs of the trajectory of ``passes``, from one pass of mergeable
    covariance sums."""
    (moments,) = passes(mean_covariance_reduction())
    return leading_eofs(moments.mean, moments.cov, k)


def _project_block(block: np.ndarray, eofs: Eofs) -> np.ndarray:
    """Amplitudes of one ``(chains, rows, d)`` block, shape ``(chains, rows, k)``."""
    chains, rows, d = block.shape
    return eofs.project(block.reshape(chains * rows, d)).reshape(chains, rows, -1)


def project_trajectory(trajectory: xr.DataArray, eofs: Eofs) -> xr.DataArray:
    """The EOF amplitudes of a ``(chain, time, component)`` trajectory, lazily: a dask-backed
    ``(chain, time, component)`` DataArray with components ``eof1..eofk``, the trajectory's
    attributes and chunking along ``time``."""
    k = eofs.patterns.shape[1]
    data = da.asarray(trajectory.data).rechunk({2: -1})
    projected = da.map_blocks(
        _project_block,
        data,
        eofs=eofs,
        dtype=np.float64,
        chunks=(data.chunks[0], data.chunks[1], (k,)),
        meta=np.empty((0, 0, 0)),
    )
    coords = {name: c for name, c in trajectory.coords.items() if "component" not in c.dims}
    return xr.DataArray(
        projected,
        dims=trajectory.dims,
        coords={**coords, "component": list(eof_names(k))},
        attrs=dict(trajectory.attrs),
        name=trajectory.name,
    )


@dataclass(frozen=True)
class EofRoute:
    """The EOFs an estimate ran on, the data's ``components`` and the ``reduce`` option."""

    eofs: Eofs
    components: list[str]
    reduce: str

    def lift(self, ds: xr.Dataset) -> xr.Dataset:
        """The amplitudes' result ``ds`` lifted back to the components (:func:`lift_result`)."""
        return lift_result(ds, self.eofs, self.components, self.reduce)


def reduce_inputs(
    passes: Passes, inputs: Inputs, reduce: str | None
) -> tuple[Inputs, EofRoute | None]:
    """With ``reduce="eof(k)"``: the EOFs fitted by one pass (:func:`fit_eofs`), and ``passes``
    and the returned inputs on the amplitudes (:func:`project_trajectory`), so that every later
    pass runs on them; without it, ``inputs`` as they are and no route."""
    modes = eof_modes(reduce)
    if reduce is None or modes is None:
        return inputs, None
    eofs = fit_eofs(passes, modes)
    components = [str(c) for c in inputs.trajectory["component"].values]
    passes.trajectory = project_trajectory(passes.trajectory, eofs)
    if passes.stored is not None:  # the store a pass falls back on reads amplitudes too
        passes.stored = project_trajectory(passes.stored, eofs)
    projected = project_trajectory(inputs.trajectory, eofs)
    return replace(inputs, trajectory=projected), EofRoute(eofs, components, reduce)


def _lifted(values: xr.DataArray, patterns: np.ndarray) -> np.ndarray:
    """One variable over ``(..., eof_i, eof_j)`` lifted to ``(..., i, j)``: a flag as the
    conjunction over every entry, a count as its largest, an error as the bound, else
    ``V values Vᵀ``."""
    array = values.values
    d = patterns.shape[0]
    shape = (*array.shape[:-2], d, d)
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        every = array.reshape(*array.shape[:-2], -1)
        summary = every.all(axis=-1) if array.dtype == bool else every.max(axis=-1)
        return np.broadcast_to(np.asarray(summary)[..., None, None], shape).copy()
    name = str(values.name)
    if "stderr" in name or name.endswith("_model_shift"):
        return lift_bound(array, patterns)
    return lift(array, patterns)


def lift_result(ds: xr.Dataset, eofs: Eofs, components: list[str], reduce: str) -> xr.Dataset:
    """The result of an estimate on the EOF amplitudes, lifted back to ``components``.

    Every variable over ``(..., i, j)`` (responses, their errors and blocking, Stein residuals)
    is lifted by :func:`_lifted` onto ``i``, ``j`` = ``components``; the amplitudes' own are kept
    with the prefix ``eof_`` on dims ``eof_i``, ``eof_j``. What describes the fitted scores (the
    basis, the density's coefficients) stays on ``component`` = ``eof1..eofk``: it is a model of
    the amplitudes. Added: ``eof_patterns(field_component, component)`` (``V``),
    ``eof_mean(field_component)``, ``eof_variance(component)``, ``eof_explained(component)``
    (fraction of the total variance), and the attributes ``reduce``, ``explained_variance`` (of
    the ``k`` EOFs together) and ``response_of`` (:data:`RESPONSE_OF`).
    """
    inner = ds.rename({"i": "eof_i", "j": "eof_j"})
    names = [name for name, v in inner.data_vars.items() if {"eof_i", "eof_j"} <= set(v.dims)]
    lifted = {}
    for name in names:
        values = inner[name]
        dims = [d for d in values.dims if d not in ("eof_i", "eof_j")]
        values = values.transpose(*dims, "eof_i", "eof_j")
        lifted[name] = ((*dims, "i", "j"), _lifted(values, eofs.patterns))
    inner = inner.rename({name: f"eof_{name}" for name in names})
    labels = np.array(components, dtype=object)
    out = inner.assign_coords(i=labels, j=labels, field_component=labels)
    out = out.assign(
        {
            **lifted,
            "eof_patterns": (("field_component", "component"), eofs.patterns),
            "eof_mean": ("field_component", eofs.mean),
            "eof_variance": ("component", eofs.variances),
            "eof_explained": ("component", eofs.explained),
        }
    )
    out.attrs.update(
        reduce=reduce,
        explained_variance=float(eofs.explained.sum()),
        response_of=RESPONSE_OF,
    )
    return out
