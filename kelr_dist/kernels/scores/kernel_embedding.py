"""Kernel-embedding density estimate ``p_M`` (paper §4, eq. 39, eq. 40).

The coefficients are plain sample means, ``ĉ_m = (1/N) Σ_n Π_k ψ_{m_k}(y_{n,k}) W^{1-β}(y_{n,k})``
(eq. 39), so a block of samples contributes the partial sums ``Σ_n Π_k T_k[n, m_k]`` — with
per-coordinate tables ``T_k`` these are one matrix product ``T_1ᵀ H`` (``H`` the products of
the other coordinates' tables, see :class:`~kelr_dist.kernels.bases.families.TensorBasis`). The
same layout makes
``p_M`` and ``∇p_M`` at many points two matrix products: ``p = rowsum((Ψ_1 C) ⊙ H_Ψ)``.

Partial sums (``chunk``), their combination (``+``) and the finished estimate (``finalize``) are
kept apart as a :class:`~kelr_dist.kernels.reduction.Reduction`. Every kernel here works on row
sub-blocks (:meth:`~kelr_dist.kernels.bases.families.TensorBasis.row_block`) so its memory does not
grow with the block it is given.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from kelr_dist.kernels.bases.families import ROW_BLOCK, Fourier, Laguerre, TensorBasis, Workspace
from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.reduction import BlockInfo, Partial, Reduction, add_partials
from kelr_dist.kernels.scores.folds import Folds, fold_stderr

Order = int | tuple[int, ...] | None


def row_blocks(n: int, size: int = ROW_BLOCK) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` rows covering ``range(n)``."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_samples(basis: TensorBasis, x: np.ndarray, name: str = "x") -> np.ndarray:
    """Validate a block of samples ``(n, d)`` for ``basis``; return it as float64.

    Raises ``ValueError`` for a wrong shape, an empty block, non-finite values and Laguerre
    coordinates below their shift.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != basis.dim:
        raise ValueError(f"{name} must have shape (n, {basis.dim}) for this basis, got {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty (no samples in this block)")
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"{name} has {int(bad.sum())} non-finite values (first at row {row}, component {col})"
        )
    for k, coord in enumerate(basis.coordinates):
        if isinstance(coord.family, Laguerre):
            low = float(x[:, k].min())
            if low < coord.loc:
                raise ValueError(
                    f"{name}: component {k} has samples down to {low:.6g}, below the Laguerre "
                    f"shift loc={coord.loc:.6g}; choose a smaller loc"
                )
    return x


#: ``p`` and ``∇p`` by :func:`_contract` from this dimension on (the tails are products of
#: several coordinates, many more than the first coordinate's degrees), else by matrix products
#: and row sums, whichever is faster with one BLAS thread as on the engine's workers (see
#: docs/benchmarks.md, section 'Tuning constants')
FUSED_FROM_DIM = 3
#: samples per tile of :func:`_contract` (the per-tail sums of a tile stay in L1)
CONTRACT_TILE = 1024


@compiled
def _contract(coef_t, stops, first, slopes, tails, tail_grads, out, out_slope, out_grads):
    """``p`` and ``∇p`` in the factored form of eq. 40, fused per tile of samples.

    With ``f_r = Σ_{m ≤ stops[r]} coef_t[r, m] first[m]`` and ``g_r`` the same sum over
    ``slopes``: ``out = Σ_r f_r tails[r]``, ``out_slope = Σ_r g_r tails[r]`` (the derivative in
    the first coordinate) and ``out_grads[k] = Σ_r f_r tail_grads[k, r]`` (in coordinate k + 2).
    All tables function-major: ``first``, ``slopes`` ``(M_1+1, n)``, ``tails (R, n)``,
    ``tail_grads (d-1, R, n)``; ``coef_t (R, M_1+1)``. The per-tail sums of a tile never leave
    the cache, and only the ``stops[r] + 1`` degrees a tail carries are summed (a GEMM sums all
    ``M_1 + 1``, the zeros of the total-degree staircase included).
    """  # pragma: no cover - compiled
    n = first.shape[1]
    f = np.empty(CONTRACT_TILE)
    g = np.empty(CONTRACT_TILE)
    for lo in range(0, n, CONTRACT_TILE):
        width = min(CONTRACT_TILE, n - lo)
        hi = lo + width
        out[lo:hi] = 0.0
        out_slope[lo:hi] = 0.0
        out_grads[:, lo:hi] = 0.0
        for r in range(tails.shape[0]):
            f[:width] = 0.0
            g[:width] = 0.0
            for m in range(stops[r] + 1):
                c = coef_t[r, m]
                row = first[m, lo:hi]
                slope = slopes[m, lo:hi]
                for i in range(width):
                    f[i] += c * row[i]
                    g[i] += c * slope[i]
            tail = tails[r, lo:hi]
            target = out[lo:hi]
            target_slope = out_slope[lo:hi]
            for i in range(width):
                target[i] += f[i] * tail[i]
                target_slope[i] += g[i] * tail[i]
            for k in range(tail_grads.shape[0]):
                grad = tail_grads[k, r, lo:hi]
                target = out_grads[k, lo:hi]
                for i in range(width):
                    target[i] += f[i] * grad[i]


#: the coefficients' variances use every VARIANCE_STRIDE-th sample (by global time index)
VARIANCE_STRIDE = 16


def coefficient_sums(
    basis: TensorBasis, x: np.ndarray, start: int = 0
) -> dict[str, np.ndarray | int]:
    """Partial sums of eq. 39 over a block of samples ``x (n, d)`` starting at time ``start``.

    Returns ``{"sum": (M_1+1, |R|), "strided_sum", "sumsq": (M_1+1, |R|), "n": n, "n_sq": n',
    "overflow": (d, max M_k + 1)}`` in the basis' layout. ``strided_sum`` and ``sumsq`` hold
    ``Σ Π_k T_k`` and ``Σ (Π_k T_k)²`` over the same ``n'`` rows, those whose time index is a
    multiple of :data:`VARIANCE_STRIDE` (the Monte-Carlo variance needs no more, and this
    halves the matrix products; the subsample does not depend on the chunking). ``overflow``
    counts, per coordinate and order, the rows whose integrand ``T_k`` was beyond float64
    (:meth:`~kelr_dist.kernels.bases.families.Hermite.weighted_polynomials`), looked for only
    in a block whose sums are not finite. A basis that varies in its first coordinate only
    (:attr:`~kelr_dist.kernels.bases.families.TensorBasis.first_only`, not Fourier) is summed by
    that coordinate's recurrence, without the tables
    (:meth:`~kelr_dist.kernels.bases.families.Family.moments`).
    """
    x = check_samples(basis, x)
    orders = basis.max_orders
    first_sq = -start % VARIANCE_STRIDE
    n_sq = len(range(first_sq, x.shape[0], VARIANCE_STRIDE))
    overflow = np.zeros((basis.dim, max(orders) + 1), dtype=np.int64)
    head, *rest = basis.coordinates
    if basis.first_only and not isinstance(head.family, Fourier):
        # Σ T_m(y_1) Π_k T_0(y_k): the first coordinate's recurrence summed as it goes
        power = 1.0 - head.family.beta
        y = head.mapped(x[:, 0])
        tails = np.ones(x.shape[0])
        for k, c in enumerate(rest, start=1):
            column = c.family.weighted_polynomials(c.mapped(x[:, k]), 0, 1.0 - c.family.beta)
            overflow[k, 0] = np.count_nonzero(~np.isfinite(column))
            tails *= column[:, 0]
        strided = slice(first_sq, None, VARIANCE_STRIDE)
        total = head.family.moments(y, orders[0], power, tails)
        total_s = head.family.moments(y[strided], orders[0], power, tails[strided])
        total_sq = head.family.moments(y[strided], orders[0], power, tails[strided] ** 2, True)
        if not overflow.any():
            overflow[0, : orders[0] + 1] = ~np.isfinite(total)
        return {"sum": total[:, None], "strided_sum": total_s[:, None],
                "sumsq": total_sq[:, None], "n": x.shape[0], "n_sq": n_sq,
                "overflow": overflow}  # fmt: skip
    total = np.zeros((orders[0] + 1, len(basis.tails)))
    total_s = np.zeros_like(total)
    total_sq = np.zeros_like(total)
    spaces = [Workspace() for _ in basis.coordinates]  # the tables' memory, reused by blocks
    for rows in row_blocks(x.shape[0], basis.row_block()):
        tables = [
            c.family.weighted_polynomials(c.mapped(x[rows, k]), m, 1.0 - c.family.beta, space)
            for k, (c, m, space) in enumerate(zip(basis.coordinates, orders, spaces, strict=True))
        ]
        tails, _ = basis.tail_products(tables)
        block = tables[0].T @ tails
        if not np.isfinite(block).all():
            for k, table in enumerate(tables):
                overflow[k, : table.shape[1]] += np.count_nonzero(~np.isfinite(table), axis=0)
        total += block
        offset = (first_sq - rows.start) % VARIANCE_STRIDE
        head_s, tails_s = tables[0][offset::VARIANCE_STRIDE], tails[offset::VARIANCE_STRIDE]
        total_s += head_s.T @ tails_s
        total_sq += np.square(head_s).T @ np.square(tails_s)
    return {"sum": total, "strided_sum": total_s, "sumsq": total_sq, "n": x.shape[0],
            "n_sq": n_sq, "overflow": overflow}  # fmt: skip


def check_coefficient_sums(basis: TensorBasis, sums: dict[str, Partial]) -> None:
    """``ValueError`` in one line when the sums of eq. 39 are not finite, naming the coordinate,
    its family and β and the lowest order whose integrand ``ψ_m W^{1-β}`` (``ℓ_m G^{1-β}``)
    overflowed (``overflow`` of :func:`coefficient_sums`), or else whose sum did."""
    if all(np.isfinite(np.asarray(sums[key])).all() for key in ("sum", "strided_sum", "sumsq")):
        return
    overflow = np.asarray(sums["overflow"])
    if overflow.any():
        order = int(np.flatnonzero(overflow.any(axis=0))[0])
        k = int(np.flatnonzero(overflow[:, order])[0])
        where = f"its integrand is beyond float64 on {int(overflow[k, order])} of the samples"
    else:
        levels = basis.levels()
        bad = ~np.isfinite(basis.from_matrix(np.asarray(sums["sum"])))
        index = basis.indices[np.flatnonzero(bad)[np.argmin(levels[bad])]] if bad.any() else None
        k = 0 if index is None else int(np.argmax(index))
        order = 0 if index is None else int(index[k])
        where = "its sum over the samples is beyond float64"
    family = basis.coordinates[k].family
    raise ValueError(
        f"kernel embedding: the coefficients (eq. 39) are not finite: coordinate {k} "
        f"({family.spec()}), order {order}: {where} (the weight to the power 1 - beta grows in "
        f"the tails for beta > 1): use beta <= 1{'' if order == 0 else ' or a lower order'}"
    )


@dataclass(frozen=True)
class KernelDensity:
    """The empirical kernel-embedding estimate ``p_{M,N} = Σ_{m∈I} ĉ_m Ψ_m`` (eq. 40).

    Attributes
    ----------
    basis : the tensor basis (index set of the fitted, highest order).
    coefficients : ``ĉ_m``, ``(P,)`` in ``basis.indices`` order (eq. 39).
    variances : Monte-Carlo variance of each ``ĉ_m`` for independent samples, ``(P,)``.
    n : number of samples.
    fold_sums, fold_counts : per held-out fold (:mod:`kelr_dist.kernels.scores.folds`) the sums of
        eq. 39's
        integrands ``(K, P)`` and the samples ``(K,)``, when the pass was split by fold.
    """

    basis: TensorBasis
    coefficients: np.ndarray
    variances: np.ndarray
    n: int
    fold_sums: np.ndarray | None = None
    fold_counts: np.ndarray | None = None

    @classmethod
    def from_sums(cls, basis: TensorBasis, sums: dict[str, Partial]) -> KernelDensity:
        """Finalize combined :func:`coefficient_sums` (or :func:`coefficient_reduction`)
        partials; ``ValueError`` naming the coordinate, order and β when they are not finite
        (:func:`check_coefficient_sums`)."""
        check_coefficient_sums(basis, sums)
        n, n_sq = int(sums["n"]), max(int(sums["n_sq"]), 1)
        mean = basis.from_matrix(np.asarray(sums["sum"])) / n
        # E[ψ²] and E[ψ] of the variance from the same (strided) rows
        mean_s = basis.from_matrix(np.asarray(sums["strided_sum"])) / n_sq
        mean_sq = basis.from_matrix(np.asarray(sums["sumsq"])) / n_sq
        variances = np.maximum(mean_sq - mean_s**2, 0.0) / n
        if "folds" not in sums:
            return cls(basis, mean, variances, n)
        folds = sums["folds"]
        fold_sums = np.stack([basis.from_matrix(np.asarray(f["sum"])) for f in folds])
        counts = np.array([int(f["n"]) for f in folds])
        return cls(basis, mean, variances, n, fold_sums, counts)

    def held_out(self, fold: int) -> KernelDensity:
        """The estimate fitted on every fold but ``fold`` (its coefficients, eq. 39)."""
        if self.fold_sums is None or self.fold_counts is None:
            raise ValueError("this estimate was not fitted by fold (coefficient_reduction(folds))")
        rest = self.n - int(self.fold_counts[fold])
        coefficients = (self.coefficients * self.n - self.fold_sums[fold]) / rest
        return KernelDensity(self.basis, coefficients, self.variances, rest)

    @classmethod
    def fit(cls, basis: TensorBasis, x: np.ndarray) -> KernelDensity:
        """Estimate from in-memory samples ``x (n, d)``."""
        return cls.from_sums(basis, coefficient_sums(basis, x))

    def mask(self, order: Order = None) -> np.ndarray:
        """Boolean ``(P,)``: the multi-indices kept by the order-``order`` truncation (eq. 38)."""
        if order is None:
            return np.ones(self.basis.size, dtype=bool)
        if isinstance(order, tuple | list):
            if len(order) != self.basis.dim:
                raise ValueError(f"order {order!r} needs {self.basis.dim} entries")
            return np.all(self.basis.indices <= np.asarray(order), axis=1)
        if order < 0 or order > self.basis.max_level:
            raise ValueError(f"order {order} is outside the fitted range 0..{self.basis.max_level}")
        return self.basis.levels() <= order

    def truncated(self, order: Order) -> KernelDensity:
        """The order-``order`` truncation (eq. 38) on its own, smaller basis: the same function
        as :meth:`matrix` ``(order)`` describes, evaluated at the cost of its own order."""
        if order is None:
            return self
        keep = self.mask(order)
        if keep.all():
            return self
        fitted = self.basis
        if fitted.index_set == "box":  # per coordinate, never above the fitted degree
            tops = order if isinstance(order, tuple | list) else (order,) * fitted.dim
            order = tuple(min(int(t), m) for t, m in zip(tops, fitted.max_orders, strict=True))
        basis = TensorBasis(fitted.coordinates, order, fitted.index_set)
        # the smaller set's multi-indices in its own layout order, looked up in ours
        position = {tuple(m): i for i, m in enumerate(fitted.indices)}
        rows = np.array([position[tuple(m)] for m in basis.indices])
        return KernelDensity(basis, self.coefficients[rows], self.variances[rows], self.n)

    def matrix(self, order: Order = None) -> np.ndarray:
        """Coefficients of the order-``order`` truncation in the basis layout ``(M_1+1, |R|)``."""
        return self.basis.to_matrix(np.where(self.mask(order), self.coefficients, 0.0))

    def evaluate(
        self, x: np.ndarray, order: Order = None, standardized: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``p_M`` and ``∇p_M`` at points ``x (n, d)``: ``(n,)`` and ``(n, d)`` (eq. 40).

        ``order`` truncates without refitting (``None``: the fitted order). ``standardized``:
        the density and gradient of the mapped coordinates ``y = (x - loc) / scale`` instead
        (no Jacobian factors: finite whatever the data's units, where ``p`` of ``x`` scales as
        ``1 / Π scale`` and its gradient as one more ``1 / scale``).
        """
        density, gradient, _ = self._evaluate(x, order, False, standardized)
        return density, gradient

    def derivatives(
        self, x: np.ndarray, order: Order = None, standardized: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``p_M``, ``∇p_M`` and the diagonal of its Hessian ``∂²_k p_M`` at ``x (n, d)``:
        ``(n,)``, ``(n, d)``, ``(n, d)`` (eq. 40 differentiated twice per coordinate);
        ``standardized`` as in :meth:`evaluate`."""
        density, gradient, second = self._evaluate(x, order, True, standardized)
        assert second is not None
        return density, gradient, second

    def _evaluate(
        self, x: np.ndarray, order: Order, second: bool, standardized: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        truncated = self.truncated(order)
        if truncated is not self:  # the tables and products of the smaller basis only
            return truncated._evaluate(x, None, second, standardized)
        return evaluate_on_basis([self], x, second, standardized)[0]

    @property
    def scales(self) -> np.ndarray:
        """Per-coordinate scales of the affine maps, ``(d,)``."""
        return np.array([c.scale for c in self.basis.coordinates])

    @property
    def jacobian(self) -> float:
        """``1 / Π_k scale_k``: the density of x from the density of y."""
        return float(1.0 / np.prod(self.scales))

    def pdf(self, x: np.ndarray, order: Order = None) -> np.ndarray:
        """``p_M`` at ``x (n, d)``, ``(n,)``."""
        return self.evaluate(x, order)[0]

    def eta(self) -> np.ndarray:
        """``η_M = (Σ_{level(m) = M+1} ĉ_m²)^{1/2}`` for M = 0..max_level-1 (eq. 54)."""
        return np.sqrt(self._shell_sums(self.coefficients**2)[1:])

    def held_out_l2(self) -> tuple[np.ndarray, np.ndarray]:
        """Held-out L² loss of every order's estimate and its standard error, each ``(levels,)``.

        For fold ``k``, with ``a = ĉ^{(-k)}`` the coefficients fitted without it and
        ``b = ĉ^{(k)}`` its own means of eq. 39's integrands,
        ``L_k(M) = Σ_{level(m) ≤ M} (a_m² - 2 a_m b_m)`` estimates ``‖p_M - p_eq‖² - ‖p_eq‖²``
        without bias (``b`` is independent of ``a``) in the norm ``‖f‖² = ∫ f² W^{1-2β}`` in
        which the basis is orthonormal, ``‖Σ c_m Ψ_m‖² = Σ c_m²`` (plain L² of the standardized
        coordinates for β = ½); the cross term is ``⟨p_M, p_eq⟩ = Σ a_m c_m`` with
        ``c_m = E b_m``.
        This is the cross-validated risk of orthogonal-series density estimators (Kronmal and
        Tarter 1968): it falls while shells carry signal and rises by their noise once they do
        not. Whole folds are held out, so time correlation within a fold does not bias it. For
        β = 1 the norm weighs the tails by ``W^{-1}``, where high-order noise is largest, so the
        loss turns up at lower orders than a plain L² loss would: as the floor of the order
        rule (:func:`~kelr_dist.kernels.scores.selection.least_adequate_order`) it errs on the safe
        side. The mean over folds and its standard error over folds are returned.
        """
        if self.fold_sums is None or self.fold_counts is None:
            raise ValueError("this estimate was not fitted by fold (coefficient_reduction(folds))")
        counts = self.fold_counts.astype(np.float64)[:, None]
        own = self.fold_sums / counts
        rest = (self.coefficients * self.n - self.fold_sums) / (self.n - counts)
        losses = np.cumsum(
            np.stack(
                [self._shell_sums(a * a - 2.0 * a * b) for a, b in zip(rest, own, strict=True)]
            ),
            axis=1,
        )
        return losses.mean(axis=0), np.asarray(fold_stderr(losses))  # (M+1,): losses are 2-D

    def eta_noise(self) -> np.ndarray:
        """Noise level of ``η_M`` for independent samples, ``(Σ_{level = M+1} Var ĉ_m)^{1/2}``."""
        return np.sqrt(self._shell_sums(self.variances)[1:])

    def _shell_sums(self, weights: np.ndarray) -> np.ndarray:
        """``Σ_{level(m) = L} weights_m`` for L = 0..max_level."""
        return np.bincount(self.basis.levels(), weights=weights, minlength=self.basis.max_level + 1)


#: a basis whose functions vary in one coordinate only is summed by its recurrence, without
#: tables (:func:`_one_coordinate`), for at most this many estimates at once (one run of the
#: recurrence for all); beyond, their running sums leave the first-level cache and the tables
#: are faster (see docs/benchmarks.md, section 'Tuning constants')
SERIES_ESTIMATES = 4


def evaluate_on_basis(
    densities: Sequence[KernelDensity],
    x: np.ndarray,
    second: bool = False,
    standardized: bool = False,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """``p_M``, ``∇p_M`` and (``second``) the diagonal of the Hessian of several estimates on
    one basis at ``x (n, d)`` (eq. 40): per estimate ``(n,)``, ``(n, d)``, ``(n, d)`` or None,
    as :meth:`KernelDensity.derivatives` gives them. The basis tables of each row block are
    built once for all of them (a fold's refit differs from the estimate only in its
    coefficients), then contracted with each one's coefficients; up to
    :data:`SERIES_ESTIMATES` estimates on a basis that varies in its first coordinate only are
    summed by that coordinate's recurrence instead (no tables)."""
    basis = densities[0].basis
    if any(density.basis != basis for density in densities):
        raise ValueError("evaluate_on_basis needs estimates on one basis")
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != basis.dim:
        raise ValueError(f"x must have shape (n, {basis.dim}), got {x.shape}")
    # tail-major (|R|, M_1+1) each, stacked: one GEMM reads a block's tables for all of them
    coef_t = np.vstack([d.matrix().T for d in densities])
    if not second and basis.first_only and len(densities) <= SERIES_ESTIMATES:
        outputs = _one_coordinate(basis, x, coef_t)
    else:
        outputs = [
            (np.empty(x.shape[0]), np.empty(x.shape), np.empty(x.shape) if second else None)
            for _ in densities
        ]
        # the tables and products of every row block in the same memory (see Workspace)
        spaces = [Workspace() for _ in range(basis.dim + 1)]
        for rows in row_blocks(x.shape[0], basis.row_block()):
            tables = _block_tables(basis, x[rows], second, spaces)
            contracted = _contract_block(basis, tables, coef_t, len(densities), second, spaces[-1])
            for out, (density, gradient, hessian) in zip(contracted, outputs, strict=True):
                density[rows], gradient[rows] = out[0], out[1]
                if hessian is not None:
                    hessian[rows] = out[2]
    if not standardized:  # from the mapped coordinates y to x
        scales = densities[0].scales
        jacobian = densities[0].jacobian
        for density, gradient, hessian in outputs:
            density *= jacobian
            gradient *= jacobian / scales
            if hessian is not None:
                hessian *= jacobian / scales**2
    return outputs


def _one_coordinate(
    basis: TensorBasis, x: np.ndarray, coefficients: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """:func:`evaluate_on_basis` (in the mapped coordinates, no Hessian) of a basis whose
    functions vary in the first coordinate only (:attr:`TensorBasis.first_only`):
    ``p = S(y_1) Π_k Ψ_0(y_k)`` with the first coordinate's series ``S``
    summed by its recurrence (:meth:`~kelr_dist.kernels.bases.families.Family.series`), no tables;
    ``coefficients`` ``(count, M_1 + 1)``."""
    first, *rest = basis.coordinates
    sums, slopes = first.family.series(first.mapped(x[:, 0]), coefficients)
    # the other coordinates' Ψ_0 and Ψ_0', and the product of the Ψ_0 but the k-th
    tails = [c.family.evaluate(c.mapped(x[:, k]), 0) for k, c in enumerate(rest, start=1)]
    values = [v[:, 0] for v, _ in tails]
    product = np.prod(values, axis=0) if values else np.ones(x.shape[0])
    others = [np.prod(values[:k] + values[k + 1 :], axis=0) for k in range(len(values))]
    outputs: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
    for s, ds in zip(sums, slopes, strict=True):
        gradient = np.empty(x.shape)
        gradient[:, 0] = ds * product
        for k, ((_, dv), other) in enumerate(zip(tails, others, strict=True), start=1):
            gradient[:, k] = s * dv[:, 0] * other
        outputs.append((s * product, gradient, None))
    return outputs


@dataclass(frozen=True)
class _Tables:
    """One row block's per-coordinate tables in the mapped coordinates (and, for
    :func:`_contract_block`, the tail products and second derivatives)."""

    mapped: list[np.ndarray]
    values: tuple[np.ndarray, ...]
    derivs: tuple[np.ndarray, ...]
    fused: tuple[np.ndarray, np.ndarray] | None  # function-major tail products (fused kernel)
    tails: tuple[np.ndarray, list[np.ndarray]] | None  # tail products and their gradients
    seconds: tuple[list[np.ndarray], list[np.ndarray]] | None  # Ψ'' tables and tail products


def _block_tables(
    basis: TensorBasis, x: np.ndarray, second: bool, spaces: list[Workspace]
) -> _Tables:
    """The tables of a row block ``x`` that every estimate on ``basis`` shares."""
    # tables in the mapped coordinates y = (x - loc)/scale; the Jacobian is applied at the end
    mapped = [c.mapped(x[:, k]) for k, c in enumerate(basis.coordinates)]
    values, derivs = zip(
        *(
            c.family.evaluate(y, m, space)
            for c, y, m, space in zip(
                basis.coordinates, mapped, basis.max_orders, spaces[:-1], strict=True
            )
        ),
        strict=True,
    )
    if not second and basis.dim >= FUSED_FROM_DIM:
        fused = basis.function_major_tail_products(list(values), list(derivs))
        return _Tables(mapped, values, derivs, fused, None, None)
    tails = basis.tail_products(list(values), list(derivs))
    seconds = None
    if second:
        per_coordinate = [
            c.family.second_derivatives(y, v, dv)
            for c, y, v, dv in zip(basis.coordinates, mapped, values, derivs, strict=True)
        ]
        seconds = (per_coordinate, basis.tail_products(list(values), per_coordinate)[1])
    return _Tables(mapped, values, derivs, None, tails, seconds)


def _contract_block(
    basis: TensorBasis,
    tables: _Tables,
    coef_t: np.ndarray,
    count: int,
    second: bool,
    products: Workspace,
) -> list[tuple[np.ndarray, ...]]:
    """``p``, ``∇p`` (and the Hessian's diagonal) of ``count`` estimates on a row block from
    their shared ``tables``; ``coef_t`` stacks their tail-major coefficients
    ``(count |R|, M_1+1)``, so each of the two GEMMs reads the tables once for all of them
    (the tables, not the coefficients, are the memory traffic); ``products`` holds the GEMMs'
    outputs."""
    values, derivs = tables.values, tables.derivs
    n, r = values[0].shape[0], coef_t.shape[0] // count
    if tables.fused is not None:
        tails_f, grads_f = tables.fused
        out: list[tuple[np.ndarray, ...]] = []
        for own in np.split(coef_t, count):  # row blocks of a C-ordered array: contiguous
            density, slope, tail_slopes = np.empty(n), np.empty(n), np.empty((basis.dim - 1, n))
            _contract(
                own, basis.first_stops, values[0].T, derivs[0].T, tails_f, grads_f,
                density, slope, tail_slopes,
            )  # fmt: skip
            out.append((density, np.column_stack([slope, tail_slopes.T])))
        return out
    assert tables.tails is not None
    tails, tail_grads = tables.tails
    # function-major (count, r, n) views: contiguous rows for the GEMM and the row sums
    firsts = np.matmul(coef_t, values[0].T, out=products.take("first", count * r, n))
    slopes = np.matmul(coef_t, derivs[0].T, out=products.take("slope", count * r, n))
    firsts, slopes = firsts.reshape(count, r, n), slopes.reshape(count, r, n)
    tails_t = tails.T
    densities = np.einsum("krn,rn->kn", firsts, tails_t)
    gradients = np.empty((count, n, basis.dim))
    gradients[:, :, 0] = np.einsum("krn,rn->kn", slopes, tails_t)
    for k, g in enumerate(tail_grads, start=1):
        gradients[:, :, k] = np.einsum("krn,rn->kn", firsts, g.T)
    if not second:
        return list(zip(densities, gradients, strict=True))
    assert tables.seconds is not None
    seconds, tail_seconds = tables.seconds
    hessians = np.empty((count, n, basis.dim))
    curvature = (coef_t @ seconds[0].T).reshape(count, r, n)
    hessians[:, :, 0] = np.einsum("krn,rn->kn", curvature, tails_t)
    for k, g in enumerate(tail_seconds, start=1):
        hessians[:, :, k] = np.einsum("krn,rn->kn", firsts, g.T)
    return list(zip(densities, gradients, hessians, strict=True))


def _coefficient_chunk(
    basis: TensorBasis,
    folds: Folds | None,
    x: np.ndarray,
    info: BlockInfo,
    _halo: np.ndarray | None,
) -> dict:
    if folds is None:
        return coefficient_sums(basis, x, info.start)
    empty = {"sum": np.zeros((basis.max_orders[0] + 1, len(basis.tails))), "n": 0}
    by_fold = [dict(empty) for _ in range(folds.count)]
    total = None
    for fold, rows in folds.segments(info):
        part = coefficient_sums(basis, x[rows], info.start + rows.start)
        by_fold[fold] = {"sum": part["sum"], "n": part["n"]}
        total = part if total is None else add_partials(total, part)
    assert total is not None
    return {**total, "folds": by_fold}


def _combine_coefficients(a: dict, b: dict) -> dict:
    out = {k: a[k] + b[k] for k in ("sum", "strided_sum", "sumsq", "n", "n_sq", "overflow")}
    if "folds" in a:
        out["folds"] = [add_partials(p, q) for p, q in zip(a["folds"], b["folds"], strict=True)]
    return out


def coefficient_reduction(basis: TensorBasis, folds: Folds | None = None) -> Reduction:
    """The density pass: chunk = :func:`coefficient_sums` (split by held-out fold when ``folds``
    is given), combine = ``+``, finalize = :meth:`KernelDensity.from_sums`."""
    return Reduction(
        name="coefficients",
        chunk=partial(_coefficient_chunk, basis, folds),
        combine=_combine_coefficients,
        finalize=partial(KernelDensity.from_sums, basis),
    )
