"""The result schema: assemble an estimate's ``xarray.Dataset``, write it, read ``p_M`` back."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr
import zarr

from kelr_dist.data.atomic import write_datasets
from kelr_dist.data.store import parse_json_attr
from kelr_dist.kernels.bases.families import TensorBasis
from kelr_dist.kernels.bases.spec import coordinates_from_spec
from kelr_dist.kernels.response.operator import Forcing, Observable, ResponseResult
from kelr_dist.kernels.scores.heldout import Choice
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity
from kelr_dist.kernels.scores.selection import typical_error
from kelr_dist.kernels.scores.stein_check import FUNCTIONS, SteinCheck

if TYPE_CHECKING:  # the steps import the engine (distributed): not needed to read a result
    from kelr_dist.pipeline.steps import KernelEmbeddingChoice


def number_attr(value: int | tuple[int, ...]) -> int | list[int]:
    """An order as an attribute: a number, or a list of numbers (zarr stores a JSON array,
    netCDF a numeric array attribute); never a string."""
    return [int(v) for v in value] if isinstance(value, tuple | list) else int(value)


def json_attr(value: Any) -> Any:
    """A provenance value as an attribute: a number or string as it is, anything else as JSON."""
    return value if isinstance(value, str | int | float) else json.dumps(value)


def assemble_result(
    *,
    responses: dict[str, ResponseResult],
    ke: KernelEmbeddingChoice | None,
    candidates: list[Choice],
    used: str,
    trajectory: xr.DataArray,
    observable: Observable,
    forcing: Forcing,
    attrs: dict[str, Any],
    checks: dict[str, SteinCheck] | None = None,
) -> xr.Dataset:
    """The result Dataset: every score's ``k(lag, i, j)`` with standard errors (and their
    blocking: ``_block_size``, ``_converged``) and lag-0 Stein residuals, its goodness of fit
    per component and test function (``checks``, by response variable), the held-out candidate
    table, and the kernel embedding's criteria per order and coefficients (labels are attached
    here and nowhere else)."""
    lags = np.arange(next(iter(responses.values())).mean.shape[0])
    dims = ("lag", "i", "j")
    data: dict[str, Any] = {}
    for name, result in responses.items():
        data[name] = (dims, result.mean)
        data[f"{name}_stderr"] = (dims, result.stderr)
        data[f"{name}_total_stderr"] = (dims, result.total_stderr)
        if result.estimator_stderr is not None:
            data[f"{name}_estimator_stderr"] = (dims, result.estimator_stderr)
        if result.model_shift is not None:
            data[f"{name}_model_shift"] = (dims, result.model_shift)
        # the blocking behind each standard error: block size K and whether sigma_K reached
        # its plateau (kelr_dist.kernels.response.blocking); unconverged error bars are too small
        data[f"{name}_block_size"] = (dims, np.asarray(result.blocking.block_size, dtype=np.int64))
        data[f"{name}_converged"] = (dims, np.asarray(result.blocking.converged, dtype=bool))
        suffix = name[len("response") :]
        data[f"stein_residual{suffix}"] = (("i", "j"), result.stein_residual)
        data[f"stein_residual{suffix}_stderr"] = (("i", "j"), result.stein_residual_stderr)
        data[f"stein_residual{suffix}_total_stderr"] = (("i", "j"), result.stein_total_stderr)
        if result.uncorrected_stein is not None:
            raw = result.uncorrected_stein
            shape = result.stein_residual.shape
            data[f"stein_residual{suffix}_uncorrected"] = (("i", "j"), raw.mean.reshape(shape))
            data[f"stein_residual{suffix}_uncorrected_stderr"] = (
                ("i", "j"),
                raw.stderr.reshape(shape),
            )
    for name, check in (checks or {}).items():
        suffix = name[len("response") :]
        fit_dims = ("component", "stein_function")
        data[f"goodness_of_fit{suffix}"] = (fit_dims, check.relative)
        data[f"goodness_of_fit{suffix}_total_stderr"] = (fit_dims, check.total_stderr / check.scale)
    coords: dict[str, Any] = {
        "lag": lags,
        "time": ("lag", lags * attrs["dt"]),
        # variable-length strings: zarr 3 has no stable spec for fixed-width unicode
        "i": _names(observable.names),
        "j": _names(forcing.columns),
        "component": _names(trajectory["component"].values),
    }
    if checks:
        coords["stein_function"] = _names(FUNCTIONS)
    if candidates:
        data.update(
            candidate_estimator=("candidate", _names([c.estimator for c in candidates])),
            candidate_order=("candidate", np.array([c.order for c in candidates])),
            candidate_ridge=("candidate", np.array([c.ridge for c in candidates])),
            candidate_loss=("candidate", np.array([c.loss for c in candidates])),
            candidate_loss_stderr=("candidate", np.array([c.loss_stderr for c in candidates])),
            candidate_chosen=("candidate", np.array([c.chosen for c in candidates])),
        )
        coords["candidate"] = np.arange(len(candidates))
    if ke is not None:
        criteria, density = ke.criteria, ke.density
        data.update(
            delta=("order", ke.deltas),
            rejection=("order", criteria.rejection(ke.deltas)),
            delta_paper=("order", criteria.delta_paper),
            rejection_paper=("order", criteria.rejection_paper()),
            negative_excursion=("order", criteria.negative_excursion),
            negative_median=("order", typical_error(criteria)),
            eta=("order", criteria.eta),
            eta_noise=("order", criteria.eta_noise),
            coefficients=("basis_function", density.coefficients),
            coefficient_variance=("basis_function", density.variances),
            multi_index=(("basis_function", "component"), density.basis.indices),
        )
        if criteria.held_out_loss is not None:
            data.update(
                held_out_l2_loss=("order", criteria.held_out_loss),
                held_out_l2_loss_stderr=("order", criteria.held_out_loss_stderr),
            )
        coords["order"] = criteria.orders
    units = trajectory.attrs.get("time_units")  # "s" from dates, see kelr_dist.data.store
    if units is not None:
        attrs = {**attrs, "time_units": str(units)}
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    ds["response"].attrs["long_name"] = f"linear response k(t) ({used})"
    ds["response_stderr"].attrs["long_name"] = "sampling standard error of k(t) (block averaging)"
    for name in responses:
        ds[f"{name}_total_stderr"].attrs["long_name"] = (
            "total standard error of k(t): sampling and the fitted score's variance "
            "(jackknife over the held-out folds)"
            if f"{name}_estimator_stderr" in ds
            else "total standard error of k(t): the sampling error (no fitted score refitted)"
        )
        if f"{name}_model_shift" in ds:
            ds[f"{name}_model_shift"].attrs["long_name"] = (
                "change of k(t) from the fitted model to its neighbour (attribute model_neighbour) "
                "on the same samples: how much the estimate still depends on the model"
            )
        if f"{name}_estimator_stderr" in ds:
            ds[f"{name}_estimator_stderr"].attrs["long_name"] = (
                "standard error of k(t) from fitting the score on finite data (jackknife over "
                "the held-out folds)"
            )
    ds["response_block_size"].attrs["long_name"] = "block size of the block-averaging stderr"
    ds["response_converged"].attrs["long_name"] = (
        "whether the block-averaging stderr reached its plateau (False: the error bar is too small)"
    )
    ds["stein_residual"].attrs["long_name"] = (
        "lag-0 Stein residual k(0) - E[d_j(c_j (A_i - mean A_i))]: estimator bias at lag 0"
    )
    if "goodness_of_fit" in ds:
        ds["goodness_of_fit"].attrs["long_name"] = (
            "Stein discrepancy E[f s_k + d_k f] of the score for test functions f of component "
            "k outside its span (tempered cubic, sine, cosine of the standardised component), "
            "as a share of E|d_k f|: 0 for the true score"
        )
    ds["time"].attrs["long_name"] = "time lag" + (f" ({units})" if units is not None else "")
    return ds


def _names(names: Sequence[Any] | np.ndarray) -> np.ndarray:
    return np.asarray([str(n) for n in names], dtype=object)


def density_from_result(ds: xr.Dataset) -> KernelDensity:
    """Rebuild the fitted ``p_M`` (highest order; truncate with ``evaluate(order=...)``)."""
    d = ds.sizes["component"]
    coordinates = coordinates_from_spec(ds.attrs["basis"], d)
    tensor = TensorBasis(tuple(coordinates), _order(ds.attrs["max_order"]), ds.attrs["index_set"])
    return KernelDensity(
        tensor,
        np.asarray(ds["coefficients"].values, dtype=np.float64),
        np.asarray(ds["coefficient_variance"].values, dtype=np.float64),
        int(ds.attrs["n_samples"]),
    )


def _order(value: Any) -> int | tuple[int, ...]:
    """An order attribute back as ``int`` or ``tuple`` (also from the JSON strings of results
    written by earlier versions)."""
    if isinstance(value, str):
        value = parse_json_attr(value, "max_order")
    if np.ndim(value) == 0:
        return int(value)
    return tuple(int(v) for v in np.asarray(value).ravel())


def check_apart(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Refuse an output ``target`` that would replace the input store ``source`` or a part of
    it: the same folder, one inside the other (symbolic links and ``..`` resolved), with or
    without ``overwrite``."""
    store, output = Path(os.path.realpath(source)), Path(os.path.realpath(target))
    if store == output:
        relation = "is the input store"
    elif store in output.parents:
        relation = "lies inside the input store"
    elif output in store.parents:
        relation = "contains the input store"
    else:
        return
    raise ValueError(
        f"output {str(target)!r} {relation} {str(source)!r}; choose an output outside it, "
        "so that the trajectory is left intact"
    )


def _attributes(path: Path) -> dict[str, Any] | None:
    """The global attributes of the netCDF file or zarr store at ``path`` (metadata only, no
    warning for an unconsolidated store), or None when it is neither."""
    try:
        if path.is_file():
            with xr.open_dataset(path) as ds:
                return dict(ds.attrs)
        return dict(zarr.open_group(path, mode="r").attrs)
    except Exception:  # anything that does not open as a dataset is not a result
        return None


def result_attrs(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The attributes of the result at ``path`` (a local zarr store or netCDF file written by
    :func:`write_result`: attributes ``estimator`` and ``kelr_dist_version``), or None when
    ``path`` holds anything else (a trajectory store, a folder, nothing, a URL)."""
    target = Path(path)
    if "://" in os.fspath(path) or not target.exists():
        return None
    attrs = _attributes(target)
    if attrs is None or "estimator" not in attrs or "kelr_dist_version" not in attrs:
        return None
    return attrs


def check_output(
    path: str | os.PathLike[str],
    overwrite: bool = False,
    source: str | os.PathLike[str] | None = None,
) -> None:
    """Refuse, before any work, an output that could not be written: it is, contains or lies
    inside the input store ``source`` (when given; even with ``overwrite``), it exists (without
    ``overwrite``; with it, when it is not an earlier result: a mistyped folder is never
    wiped), or its nearest existing ancestor is not a writable folder (a read-only directory, a
    regular file in the path). The message names the path as given."""
    if source is not None:
        check_apart(source, path)
    target = Path(path)
    if target.exists() and not overwrite:
        raise ValueError(
            f"output {str(path)!r} exists; remove it, choose another path or pass --overwrite "
            "(overwrite=True)"
        )
    if target.exists() and result_attrs(target) is None:  # only an earlier result is replaced
        raise ValueError(
            f"output {str(path)!r} exists and is not a kelr_dist result; overwriting replaces "
            "only an earlier result: remove it yourself or choose another path"
        )
    ancestor = target.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(
            f"output {str(path)!r} cannot be created: {str(ancestor)!r} is a file, not a folder"
        )
    try:  # a real probe: permissions, read-only mounts and immutable folders alike
        handle, probe = tempfile.mkstemp(prefix=".kelr-probe-", dir=ancestor)
    except OSError as err:
        raise ValueError(
            f"output {str(path)!r} cannot be created: the folder {str(ancestor)!r} is not "
            f"writable ({err.strerror})"
        ) from None
    os.close(handle)
    os.unlink(probe)


def write_result(
    ds: xr.Dataset,
    path: str | os.PathLike[str],
    overwrite: bool = False,
    *,
    also: Sequence[str | os.PathLike[str]] = (),
) -> None:
    """Write a result atomically (``kelr_dist.data.atomic.write_datasets``) to ``path``
    and every path in ``also``, all or nothing: each is written to a temporary sibling and
    flushed, and only when every one succeeded are they put in place; ``*.nc`` gives netCDF,
    anything else a zarr store. An interrupted or failed write (a full disk) leaves every path
    as it was; an output over the store the result was estimated from (``ds.attrs["store"]``)
    is refused.

    Parameters
    ----------
    ds : a result of :func:`~kelr_dist.estimate_response` (or one opened again).
    path : where to write it: a ``*.nc`` path gives a netCDF file, any other a zarr store.
    overwrite : replace an existing output at ``path`` (and at the paths in ``also``).
    also : more paths to write the same result to, in the same all-or-nothing step (a zarr
        store and a netCDF copy, say).

    Raises
    ------
    ValueError
        an output that exists (without ``overwrite``), overlaps the input store or cannot be
        created (``check_output``).
    ``kelr_dist.data.atomic.OutputExists``
        another writer created an output while this one wrote (a ``FileExistsError``); the
        other writer's output is kept and nothing of this one is left.
    OSError
        a write failed (full disk, ...; the message names the path).
    """
    store = ds.attrs.get("store")
    targets = [path, *also]
    for target in targets:
        check_output(target, overwrite, store if store and os.path.exists(str(store)) else None)
    write_datasets(ds, targets, overwrite)
