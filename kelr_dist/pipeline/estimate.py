"""The whole estimate: validate the options and compose the steps into ``estimate_response``.

It follows the paper's §4 algorithm, plus a second score estimator and a held-out choice between
them.

``estimate_response`` composes the steps of :mod:`kelr_dist.pipeline.steps`, each one read of the
data:

====  ======================================================  ===================================
read  reductions (sharing the read)                           gives
====  ======================================================  ===================================
1     moments, ``Ā`` (+ mean/covariance for baselines)         basis choice (step 1), centring
1b    Gamma fit (only for Laguerre without θ)                  Laguerre θ and scale
2     coefficient sums and score-matching Gram sums, by fold   ``p_M`` (eq. 39), ``G``, ``b``
      (+ KDE bins)
2p    ``estimator="auto"``, long data: every k-th sample      whether the kernel embedding is
      gathered; the kernel embedding fitted, swept and scored  fitted to all samples (read 2k)
      on it in memory
3     δ/R/η sweep over every order                             order and δ (eqs. 52–54)
4     lagged sums for every score, Stein residuals, the        ``k(lag, i, j)`` with error bars,
      kernel embedding's held-out loss, every score's          the estimator choice, the
      Stein identity with test functions beyond its span       goodness-of-fit check
====  ======================================================  ===================================

Read 3 is skipped for ``estimator="score-matching"`` and when the pilot leaves the kernel
embedding out; score matching's degree is chosen from the fold sums of read 2 without a read of
its own. ``estimate_response`` validates its arguments into
:class:`~kelr_dist.pipeline.options.EstimateOptions` once, checks them against the data
(:func:`~kelr_dist.pipeline.inputs.check_inputs`), settles read 1
(:func:`~kelr_dist.pipeline.planning.settle`), builds a :class:`~kelr_dist.pipeline.planning.Plan`
(:func:`~kelr_dist.pipeline.planning.plan_estimate`), composes the steps and the fits of
:mod:`kelr_dist.pipeline.fits`; :func:`~kelr_dist.pipeline.conclude.conclude` makes the choice,
the warnings (:mod:`kelr_dist.pipeline.warnings`) and the attributes. The result is an
``xarray.Dataset`` (see :func:`estimate_response`, assembled by :mod:`kelr_dist.pipeline.result`,
which also writes it and rebuilds ``p_M`` from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist.engine.cluster import client_for
from kelr_dist.kernels.response.operator import (
    Forcing,
    Observable,
)
from kelr_dist.kernels.scores.folds import DEFAULT_FOLDS
from kelr_dist.pipeline.conclude import conclude
from kelr_dist.pipeline.eof import reduce_inputs
from kelr_dist.pipeline.fields import field_result
from kelr_dist.pipeline.fits import (
    goodness_of_fit,
    kernel_embedding,
    response_read,
    response_scores,
)
from kelr_dist.pipeline.inputs import check_inputs
from kelr_dist.pipeline.options import ClusterOptions, EstimateOptions, checked, python_name
from kelr_dist.pipeline.planning import plan_estimate, settle
from kelr_dist.pipeline.steps import (
    check_user_functions,
    choose_score_matching,
    fit_estimators,
    open_passes,
    respond,
)


def estimate_response(
    trajectory: Any,
    *,
    variable: str = "x",
    components: Sequence[str] | str | None = None,
    estimator: str = "auto",
    basis: str | Sequence[Any] = "auto",
    order: Any = "auto",
    max_order: Any = None,
    index_set: str = "auto",
    neighbours: Any = None,
    symmetry: str = "none",
    degree: Any = "auto",
    folds: int = DEFAULT_FOLDS,
    max_lag: int | None = None,
    max_time: float | None = None,
    delta: str | float = "auto",
    observable: Observable | None = None,
    forcing: Forcing | Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
    exact: bool = False,
    score: Callable[[np.ndarray], np.ndarray] | None = None,
    kde: bool = False,
    gaussian: bool = False,
    stein_correction: bool = True,
    pilot: bool = True,
    reduce: str | None = None,
    client: Any = None,
    n_workers: int | None = None,
    memory_limit: Any = None,
    progress: bool | None = None,
    dt: float | None = None,
) -> xr.Dataset:
    """Linear response ``k(lag, i, j)`` of a trajectory (eq. 5, eq. 6).

    Parameters
    ----------
    trajectory : a store path, an xarray ``Dataset``/``DataArray`` in the store layout (one
        opened from a netCDF or other non-zarr file is read through the object), or a numpy
        array ``(n, d)`` / ``(chains, n, d)`` or pandas DataFrame (sample interval ``dt``,
        default 1 in ``time_units = "steps"``, when ``max_time`` is not given). Unnamed
        components are ``x1, x2, ...`` by every route. A field ``(time, lat, lon, ...)`` (any
        grid dims) is estimated on its grid points (``kelr_dist.data.fields``): points NaN
        at every time are dropped (``attrs["field_masked"]``), and the result's ``i`` and ``j``
        come back as ``i_<dim>``/``j_<dim>`` over the grid (``kelr_dist.pipeline.fields``).
    variable : the trajectory variable of a store/Dataset.
    components : estimate on these components only, by name (a list, or ``"x1,x3"``), in the
        order given; ``None``: all (``kelr estimate --components``).
    estimator : the score estimate: ``"kernel-embedding"`` (the paper's ``∇ log p_M``),
        ``"score-matching"`` (Hyvärinen 2005, ``kelr_dist.kernels.scores.score_matching``) or
        ``"auto"``: both, and the one with the smaller held-out Hyvärinen loss
        (``kelr_dist.kernels.scores.heldout``).
    basis : ``"auto"`` or a per-coordinate spec, e.g. ``"laguerre(theta=1),hermite"``
        (``kelr_dist.kernels.bases.spec.parse_basis_spec``), or a list of coordinates; both
        estimators
        use its coordinate families and affine maps.
    order : kernel embedding: ``"auto"`` (criteria of §4), an order ``M`` or a box tuple.
    max_order : highest order fitted and scanned (default: the budget of
        ``kelr_dist.pipeline.steps.kernel_embedding_max_order``).
    index_set : ``"auto"``: for the kernel embedding total degree (``|m|_1 ≤ M``) unless at
        most one coordinate carries structure beyond its weight
        (``kelr_dist.kernels.scores.selection.active_coordinates``), then a box with order 0 on
        the others, as in the paper's Langevin example; for score matching (unless ``degree`` is
        given) the held-out total degree grown by held-out loss in a dictionary of higher
        single-coordinate and pairwise degrees (``kelr_dist.kernels.scores.index_sets.grow``)
        of at most ``5 N^(1/3)`` features for ``N`` samples, capped by the Gram pass's flop
        budget (``kelr_dist.pipeline.steps.dictionary_budget``; attributes
        ``score_matching_features``, ``score_matching_max_degrees``). ``"total"``: total degree
        for both, fixed; ``"box"``: ``m_k ≤ M_k``; ``"adaptive"``: ``"auto"`` (no ``degree``
        may be given); ``"local"``, ``"local-adaptive"``: the local score model below, the
        latter with its index set grown by held-out loss
        (``kelr_dist.kernels.scores.local.grow_local``).
    neighbours, symmetry : the local score model (``kelr_dist.kernels.scores.local``; the
        default from 10 components on, ``index_set="local"`` below): ``neighbours`` ``"ring"``,
        ``"grid(n1,n2)"``, a mapping of component names to their neighbours' names or a list of
        neighbour index lists (``None``: the store's ``neighbours`` attribute, else each
        component's strongest partial correlations); ``symmetry="translation"`` ties the
        weights of all sites of a ring or grid. Attributes ``local_radius``,
        ``neighbourhoods``, ``symmetry``; a declared ring or grid also ``lattice``
        (``"ring(16)"``, ``"grid(8,8)"``: the report draws the response against its distance).
    degree : score matching: ``"auto"`` (held-out loss over total degrees, then the grown set
        of ``index_set="auto"``; with ``index_set="total"`` degrees ``1..q_max`` of
        ``kelr_dist.pipeline.steps.score_matching_max_degree``) or a total degree ``q`` (a
        fixed total-degree set).
    folds : held-out folds (whole chains, or contiguous blocks of each chain).
    max_lag, max_time : largest lag in rows or in time units (one of them).
    delta : ``"auto"`` (error-tied threshold, ``kelr_dist.kernels.scores.selection.choose_delta``),
        ``"paper"`` (``δ_M`` of eq. 52) or a number, in standardized units (the density of
        ``(x - loc) / scale``).
    observable, forcing : ``A`` and ``c`` (default identity and constant forcing): objects, or
        names and references as in a job file; a forcing may also be a function
        ``x (n, d) -> (c, ∂_i c_i)``, each ``(n, d)``. ``A`` enters centred (covariance form,
        ``kelr_dist.kernels.response.operator``).
        A field's observables: ``"mean"``, ``"mean(weights=cos(lat))"`` (a coordinate over the
        grid, or its cosine in degrees) and ``"eof(k)"`` (leading EOF amplitudes); a field's
        forcing may be a pattern, a ``DataArray`` over its grid dims or ``"pattern=FILE:VARIABLE"``
        naming one in a netCDF file or zarr store (``pattern_response``).
        A :class:`~kelr_dist.Forcing` with ``patterns`` adds the constant forcing along each
        pattern as a column of its own (``j`` = its name).
        The distribution observables ``"pdf"``, ``"moments"``, ``"exceedance"`` (with
        parameters, ``kelr_dist.kernels.observables.distribution``) take their grid from the
        data; :func:`~kelr_dist.distribution_response` labels their responses.
    exact : also the exact-FDT response with the model's score (built-in models know it from the
        store's attributes); ``score`` gives a score function ``X (n, d) -> ∇ log p (n, d)``, a
        callable or ``"package.module:function"`` (imported, never evaluated).
    kde, gaussian : also the Gaussian-KDE (d ≤ 3) and quasi-Gaussian baselines (§5).
    stein_correction : refit the estimated scores (kernel embedding, score matching; not the
        baselines) by the affine Stein correction
        (``kelr_dist.kernels.response.stein_correction``), in the response read, or, for an
        observable that is not affine in ``x`` (``"square"``, a user's function, a
        distribution), on the observable's own functions too, and with
        ``symmetry="translation"`` on the local model's site sums, in one read before it
        (``kelr_dist.pipeline.fits.stein_refit``: every column of ``A`` then has its exact
        lag-0 response, and the conjugate of a forcing pattern is fitted in functions of the
        whole field);
        ``False`` gives the uncorrected estimators (the paper's own ``B̂``).
    pilot : with ``estimator="auto"`` on at least 250 000 samples, fit the kernel embedding to
        a strided subsample first, and to all samples only when its held-out loss there can
        still win (``kelr_dist.pipeline.steps.pilot_kernel_embedding``); ``False`` fits
        both families to all samples.
    reduce : ``"eof(k)"``: estimate on the leading ``k`` EOFs (principal components, from one
        pass of covariance sums, ``kelr_dist.pipeline.eof``) and lift the response back to
        the components as ``V k Vᵀ``: the response of the projected dynamics (attributes
        ``response_of``, ``explained_variance``; the amplitudes' own result as ``eof_*``). Only
        with the identity observable and constant forcing; the other options (basis, degree,
        baselines) apply to the amplitudes ``eof1..eofk``.
    client : a ``distributed.Client``, a scheduler address, ``None`` (the embedded
        ``LocalCluster``) or ``"synchronous"`` (no cluster: the same passes in this process).
    n_workers, memory_limit : size of the embedded cluster.
    progress : progress bars (``None``: when stderr is a terminal).

    Returns
    -------
    xarray.Dataset
        ``response(lag, i, j)`` and ``response_stderr`` from the chosen estimator
        (``attrs["estimator"]``); with ``estimator="auto"`` the other one as
        ``response_kernel_embedding`` or ``response_score_matching``;
        ``response_exact``/``_kde``/``_gaussian`` (+ ``_stderr``) when asked; for every response
        the lag-0 Stein residual ``stein_residual[_suffix](i, j)`` and its ``_stderr`` (for a
        corrected estimate also ``..._uncorrected``: the size of the correction); the
        held-out candidates on ``candidate``; the kernel embedding's criteria on ``order`` and
        coefficients on ``basis_function``; the run's choices in ``attrs``. For a field, ``i``
        and ``j`` as ``i_<dim>``/``j_<dim>`` over the grid; with a forcing pattern the points'
        columns times the pattern and the pattern's own column as ``pattern_<variable>``:
        ``pattern_response(lag, i)``, its ``_stderr`` and ``_total_stderr``, ...; with
        ``eof(k)`` ``eof_loading`` and ``eof_explained_variance``.

    Warns
    -----
    BiasWarning
        when the chosen estimate's Stein residual exceeds 3 total standard errors.
    DisagreementWarning
        (``estimator="auto"``) when the two families' responses differ by more than 5 standard
        errors of their difference (attribute ``estimator_disagreement``) while their held-out
        losses are within 2 standard errors of each other.
    TruncationWarning
        when the chosen degree or order is the largest the budget allowed and the held-out loss
        was still falling there.
    SensitivityWarning
        when the response moves by more than one total standard error as the chosen model gets
        two steps richer, or (score matching) is refitted with random Fourier features
        (``kelr_dist.pipeline.steps.extend_score``; ``response_model_shift``, attributes
        ``model_sensitivity``, ``model_neighbour``).
    GoodnessOfFitWarning
        when the chosen score fails Stein's identity for a cubic, sine or cosine of some
        component beyond the Šidák threshold of a family-wise 1% (``goodness_of_fit``,
        attributes ``goodness_of_fit_z``, ``goodness_of_fit_threshold``).
    ConvergenceWarning
        when the block averaging of some entries of the chosen estimate reached no plateau
        (``response_converged`` False; per-entry block sizes in ``response_block_size``).
    """
    started = time.perf_counter()
    options = checked(
        EstimateOptions,
        dict(
            variable=variable, components=components, estimator=estimator, basis=basis,
            order=order, max_order=max_order, index_set=index_set, neighbours=neighbours,
            symmetry=symmetry, degree=degree, folds=folds,
            max_lag=max_lag, max_time=max_time, delta=delta, observable=observable,
            forcing=forcing, exact=exact, score=score, kde=kde, gaussian=gaussian,
            stein_correction=stein_correction, pilot=pilot, dt=dt, reduce=reduce,
        ),
    )  # fmt: skip
    cluster = checked(ClusterOptions, dict(client=client, n_workers=n_workers,
                      memory_limit=memory_limit, progress=progress), python_name)  # fmt: skip
    inputs = check_inputs(trajectory, options)
    # a client made here from an address is closed at the end (also on an error)
    with client_for(
        cluster.scheduler, n_workers=cluster.workers, memory_limit=cluster.memory_limit, quiet=True
    ) as run_on:
        check_user_functions(options.score, options.observable, options.forcing, run_on)
        passes = open_passes(inputs.trajectory, run_on, cluster.progress)
        field = inputs.trajectory  # the grid's layout, before any reduction
        inputs, route = reduce_inputs(passes, inputs, options.reduce)  # reduce="eof(k)"
        setting = settle(passes, options, inputs)
        plan = plan_estimate(passes, options, inputs, setting)
        fits = fit_estimators(
            passes,
            density_basis=None if plan.pilot else plan.density_basis,
            features=plan.features,
            folds=inputs.folds,
            kde_grid=plan.kde_grid,
        )
        sm = (
            None
            if fits.gram is None
            else choose_score_matching(fits.gram, inputs.degree, plan.grown)
        )
        ke, piloted = kernel_embedding(passes, options, inputs, plan, fits.density, sm)
        found = response_scores(passes, inputs, setting, plan, (ke, sm, fits))
        response = response_read(inputs, setting, plan, found)
        held_out = None if ke is None or sm is None else (ke, inputs.folds)
        check = goodness_of_fit(inputs, setting, found[0], found[1])
        out = respond(passes, response, held_out, check)
    result = conclude(options, inputs, setting, plan, passes, (ke, sm, piloted), out, started)
    if route is not None:
        result = route.lift(result)
    return field_result(result, field, setting.observable, inputs.pattern)
