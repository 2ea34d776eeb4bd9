"""Reports: errors against an analytic OU response, the summary table, PNG figures."""

import json

import numpy as np
import pytest
import xarray as xr

from kelr_dist.edges.report import (
    TITLE_WIDTH,
    chosen_order,
    open_result,
    plot_density,
    plot_responses,
    response_errors,
    summary,
    write_figures,
)
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.estimate import estimate_response
from kelr_dist.pipeline.result import write_result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DT = 0.05


def analytic_result(n_lags=401):
    """A result-shaped Dataset whose estimates are ``expm(-Γt)`` plus known perturbations."""
    model = make_model("ou")
    lags = np.arange(n_lags)
    time = lags * DT
    exact = model.response(time)  # (T, 2, 2)
    estimate = exact.copy()
    estimate[10, 0, 0] += 0.03  # diagonal error at t = 0.5
    estimate[50, 1, 0] -= 0.07  # off-diagonal error at t = 2.5
    estimate[300, 0, 1] += 5.0  # at t = 15 > 10: outside the error horizon
    kde = exact + 0.2
    dims = ("lag", "i", "j")
    return xr.Dataset(
        {
            "response": (dims, estimate),
            "response_stderr": (dims, np.full(exact.shape, 0.01)),
            "response_exact": (dims, exact),
            "response_kde": (dims, kde),
        },
        coords={"lag": lags, "time": ("lag", time), "i": ["x1", "x2"], "j": ["x1", "x2"]},
        attrs={"order": "7", "delta": 1e-7, "rejection": 0.0012, "dt": DT, "basis": "auto"},
    )


def test_errors_against_the_analytic_response():
    ds = analytic_result()
    errors = response_errors(ds)
    assert set(errors) == {"response", "response_kde"}
    assert errors["response"]["diagonal"] == pytest.approx(0.03, rel=1e-12)
    assert errors["response"]["off_diagonal"] == pytest.approx(0.07, rel=1e-12)
    assert errors["response"]["stderr"] == pytest.approx(0.01)
    assert errors["response_kde"]["diagonal"] == pytest.approx(0.2, rel=1e-12)
    # a longer horizon sees the error at t = 15
    assert response_errors(ds, horizon=20.0)["response"]["off_diagonal"] == pytest.approx(5.0)
    assert response_errors(ds.drop_vars("response_exact")) == {}


def test_errors_without_off_diagonal_entries():
    ds = analytic_result().isel(i=[0], j=[0])
    errors = response_errors(ds)["response"]
    assert errors["diagonal"] == pytest.approx(0.03) and np.isnan(errors["off_diagonal"])


def test_summary_table():
    text = summary(analytic_result(), "out.zarr")
    assert "out.zarr" in text
    assert "order M     7" in text
    assert "1e-07" in text and "0.0012" in text
    assert "max over t <= 10 of |k - k_exact|" in text
    row = next(line for line in text.splitlines() if "kernel embedding" in line)
    assert row.split()[-3:] == ["0.03", "0.07", "0.01"]
    assert chosen_order(analytic_result()) == 7
    assert chosen_order(analytic_result().assign_attrs(order="[90, 0]")) == (90, 0)


def test_response_figure_has_every_entry():
    raw = plot_responses(analytic_result())
    titles = sorted(ax.get_title() for ax in raw.axes if ax.get_visible())
    assert titles == ["k[x1, x1](t)", "k[x1, x2](t)", "k[x2, x1](t)", "k[x2, x2](t)"]
    assert "sampling error only" in raw.texts[0].get_text()  # the caption says what bands cover
    fig = plot_responses(analytic_result(), normalise=True)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4
    titles = sorted(ax.get_title() for ax in axes)
    assert titles == [
        "k[x1, x1](t)  (normalised)", "k[x1, x2](t)", "k[x2, x1](t)", "k[x2, x2](t)  (normalised)"
    ]  # fmt: skip
    # response, kde, exact per panel (and the stderr band)
    assert all(len(ax.get_lines()) >= 3 for ax in axes)


@pytest.fixture(scope="module")
def ou_result(tmp_path_factory):
    """A real (small) estimate of a simulated OU store, written as zarr."""
    folder = tmp_path_factory.mktemp("report")
    simulate("ou", folder / "ou.zarr", 20000, chunk=5000, progress=False)
    ds = estimate_response(
        folder / "ou.zarr", max_order=6, max_lag=40, exact=True, kde=True, client="synchronous"
    )
    write_result(ds, folder / "result.zarr")
    return folder


def test_figures_are_png_files(ou_result):
    ds = open_result(ou_result / "result.zarr")
    written = write_figures(ds, ou_result / "figures")
    assert sorted(p.name for p in written) == [
        "criteria.png", "density.png", "response.png", "selection.png"
    ]  # fmt: skip
    for path in written:
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 20_000, path
    assert not list((ou_result / "figures").glob(".*"))  # no temporary files left


def test_density_figure_compares_with_the_true_density(ou_result):
    ds = open_result(ou_result / "result.zarr")
    fig = plot_density(ds)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert "true p_eq" in titles and "|p_M - p_eq|" in titles
    # the marginal panels show p_M and the true marginal; both integrate to about 1
    marginal = next(ax for ax in fig.axes if ax.get_title() == "marginal density of x1")
    for line in marginal.get_lines():
        x, y = line.get_data()
        assert np.trapezoid(y, x) == pytest.approx(1.0, abs=0.05)
    # without a known model there is no reference
    anonymous = ds.copy()
    anonymous.attrs = {k: v for k, v in ds.attrs.items() if k not in ("model", "model_params")}
    titles = [ax.get_title() for ax in plot_density(anonymous).axes if ax.get_visible()]
    assert "true p_eq" not in titles and "estimated p_M" in titles


def _panels(fig) -> list:
    """The visible axes of a figure that are plots (not colour bars)."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def test_no_density_panel_is_empty_and_the_density_is_named(ou_result):
    """Every panel of density.png draws something; the title says which density it is and,
    when the response used score matching, that it is not that estimator's."""
    ds = open_result(ou_result / "result.zarr")
    for data in (ds, ds.assign_attrs(model="none")):
        fig = plot_density(data)
        for ax in _panels(fig):
            assert ax.get_lines() or ax.collections, ax.get_title()
        assert "the kernel embedding's p_M" in fig.get_suptitle()
    used = plot_density(ds.assign_attrs(estimator="score-matching")).get_suptitle()
    assert "the response used score matching, whose score is not the gradient" in used


def test_selection_puts_order_and_degree_on_their_own_axes_and_clips_nothing(ou_result):
    """Order M and degree q have one axis each; every candidate's loss and error bar lies
    inside the loss axis, also when an unstable degree's loss is far above the best."""
    from kelr_dist.edges.report import plot_selection

    ds = open_result(ou_result / "result.zarr")
    degrees = ds["candidate_order"].values
    sm = ds["candidate_estimator"].values == "score-matching"
    loss = ds["candidate_loss"].values.copy()
    loss[sm & (degrees == degrees[sm].max())] = 5e3  # an unstable highest degree
    for data in (ds, ds.assign(candidate_loss=("candidate", loss))):
        fig = plot_selection(data)
        axes = _panels(fig)
        assert [ax.get_title() for ax in axes] == ["kernel embedding", "score matching"]
        assert axes[0].get_xlabel().startswith("order M")
        assert axes[1].get_xlabel().startswith("degree q")
        low, high = axes[0].get_ylim()
        for ax in axes:  # every point drawn, with its error bar, is inside the loss axis
            for container in ax.containers:
                for segment in container.lines[2][0].get_segments():
                    assert low <= segment[:, 1].min() and segment[:, 1].max() <= high
    assert 5e3 in axes[1].containers[0].lines[0].get_ydata()  # drawn, inside the axes


def test_response_legend_colours_each_band_as_its_estimate_and_marks_the_chosen(ou_result):
    """The legend pairs each estimate's line with its own band (same colour), and names the
    chosen estimator."""
    from matplotlib.colors import to_rgb

    ds = open_result(ou_result / "result.zarr")
    legend = plot_responses(ds).axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    chosen = ds.attrs["estimator"].replace("-", " ")
    assert f"{chosen}, chosen ± 2 total stderr" in texts
    assert "exact FDT" in texts
    for handle in legend.legend_handles:
        assert handle is not None
    figure = plot_responses(ds)
    ax = figure.axes[0]
    for band, line in zip(ax.collections, ax.get_lines()[: len(ax.collections)], strict=True):
        assert to_rgb(band.get_facecolor()[0][:3]) == to_rgb(line.get_color())


def test_open_result_errors(tmp_path, ou_result):
    with pytest.raises(ValueError, match="does not exist"):
        open_result(tmp_path / "missing.zarr")
    xr.Dataset({"x": ("time", np.zeros(3))}).to_zarr(tmp_path / "other.zarr", consolidated=False)
    with pytest.raises(ValueError, match=r"holds no variable response\(lag, i, j\)"):
        open_result(tmp_path / "other.zarr")
    (tmp_path / "junk.nc").write_text("not netcdf")
    with pytest.raises(ValueError, match="is not a readable result"):
        open_result(tmp_path / "junk.nc")
    ds = open_result(ou_result / "result.zarr")
    assert json.loads(ds.attrs["model_params"])["dt"] == DT


def test_a_written_result_opens_without_warnings(tmp_path, ou_result):
    import warnings

    ds = open_result(ou_result / "result.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_result(ds, tmp_path / "again.zarr")  # nothing to silence in the caller either
        xr.open_zarr(ou_result / "result.zarr").load()  # consolidated metadata
        again = xr.open_zarr(tmp_path / "again.zarr").load()
    assert list(again["i"].values) == ["x1", "x2"]
    with pytest.raises(ValueError, match=r"output '.*again.zarr' exists"):
        write_result(ds, tmp_path / "again.zarr")


def test_summary_and_headline_show_the_blocking_convergence():
    from kelr_dist.edges.report import headline, response_names

    ds = analytic_result()
    assert "error bars  -" in summary(ds)  # a result without the flags
    converged = np.ones(ds["response"].shape, dtype=bool)
    ds["response_converged"] = (("lag", "i", "j"), converged)
    ds["response_block_size"] = (("lag", "i", "j"), np.full(converged.shape, 256))
    assert "converged for all 1604 entries (block size 256)" in summary(ds)
    converged[200:, 0, 1] = False
    ds["response_converged"] = (("lag", "i", "j"), converged)
    assert "NOT converged for 201 of 1604 entries" in summary(ds)
    # the companions are not listed as responses; the order is fixed
    assert response_names(ds) == ["response", "response_kde", "response_exact"]
    lines = headline(ds, "out.zarr").splitlines()
    assert lines[0].split() == ["wrote", "out.zarr"] and len(lines) == 5
    assert "max stderr    0.01 (sampling error; blocking NOT converged" in lines[2]


def test_unconverged_error_bars_warn_once(tmp_path):
    from kelr_dist.pipeline.warnings import ConvergenceWarning

    simulate("ou", tmp_path / "short.zarr", 4000, chunk=2000, progress=False)
    # the lags named as times in the data's unit, as the result's time coordinate names them
    message = r"error bars of \d+ of \d+ response entries \(at times [0-9.]+\.\.[0-9.]+\)"
    with pytest.warns(ConvergenceWarning, match=message):
        ds = estimate_response(
            tmp_path / "short.zarr", max_order=4, max_lag=1000, client="synchronous"
        )
    assert not ds["response_converged"].values.all()
    assert ds["response_converged"].dtype == bool and ds["response_block_size"].dtype.kind == "i"
    assert "NOT converged" in summary(ds)


def test_every_figure_axis_is_labelled_and_criteria_show_the_reason(ou_result):
    from kelr_dist.edges.report import plot_criteria, plot_selection

    ds = open_result(ou_result / "result.zarr")
    for fig in (plot_criteria(ds), plot_responses(ds), plot_selection(ds), plot_density(ds)):
        for ax in (ax for ax in fig.axes if ax.get_visible()):
            label = ax.get_ylabel() or ""
            if ax.get_xlabel():  # a plot panel (a colour bar has its label on y only)
                assert "(" in ax.get_xlabel(), ax.get_xlabel()
            assert label and "(" in label, (ax.get_title(), label)  # units or (dimensionless)
    fig = plot_criteria(ds)
    reason = fig.get_suptitle()
    assert f"chosen M = {chosen_order(ds)}" in reason and "η_M stays below" in reason
    assert max(map(len, reason.splitlines())) <= TITLE_WIDTH  # wrapped, not clipped at the edges
    eta_axis = fig.axes[0]
    assert eta_axis.get_ylim()[0] > 1e-8  # not stretched to the ~1e-16 of η_0


def stein_result(lag0_x2=1e-12, lag0_x2_stderr=1e-3):
    """:func:`analytic_result` with lag-0 Stein residuals: corrected ~0 (rounding), uncorrected
    0.04 in every entry; row x2 of k(0) set to ``lag0_x2`` (a near-constant component)."""
    ds = analytic_result()
    k = ds["response"].values.copy()
    k[0, 1, :] = lag0_x2
    stderr = ds["response_stderr"].values.copy()
    stderr[0, 1, :] = lag0_x2_stderr
    ds["response"] = (("lag", "i", "j"), k)
    ds["response_stderr"] = (("lag", "i", "j"), stderr)
    ij = ("i", "j")
    ds["stein_residual"] = (ij, np.full((2, 2), 4.55e-14))
    ds["stein_residual_stderr"] = (ij, np.full((2, 2), 0.01))
    ds["stein_residual_uncorrected"] = (ij, np.full((2, 2), 0.04))
    ds["stein_residual_uncorrected_stderr"] = (ij, np.full((2, 2), 0.01))
    return ds


def stein_table(text):
    """The rows of the Stein table of a summary: header first."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("lag-0 Stein residual"))
    return [line for line in lines[start + 1 :] if line.startswith("  ")][:2]


def test_the_share_of_k0_is_shown_only_where_k0_is_away_from_0():
    from kelr_dist.edges.report import headline

    # row x2 of k(0) is ~0 (within its error bars): no share (it was 4e+10%), only row x1's
    header, row = stein_table(summary(stein_result(1e-12, 1e-3)))
    # the uncorrected ratio and the share apart, the header's columns over their cells
    assert row.split()[-2:] == ["4", "4.0%"]
    assert "4 stderr = 4.0% of k(0)" in headline(stein_result(1e-12, 1e-3), "out.zarr")
    assert header.rstrip().endswith("% of k(0)") and len(header.rstrip()) == len(row.rstrip())
    # no row well away from 0 at all: a dash, never a number
    ds = stein_result(1e-12, 1e-3)
    ds["response"][0] = 1e-12
    header, row = stein_table(summary(ds))
    assert row.split()[-1] == "—" and "%" not in row
    assert "of k(0)" not in headline(ds, "out.zarr")
    # without error bars, rows below 1e-6 of the largest |k(0)| are left out
    header, row = stein_table(summary(stein_result(1e-12).drop_vars("response_stderr")))
    assert row.split()[-1] == "4.0%"


def test_a_residual_exact_by_construction_reads_the_same_in_the_table_and_the_headline():
    from kelr_dist.edges.report import headline

    ds = stein_result()  # corrected residual 4.55e-14: rounding, 0 by construction
    header, row = stein_table(summary(ds))
    assert "0 (by construction)" in row and "e-14" not in row and "e-12" not in row
    assert row.split()[-2:] == ["4", "4.0%"]
    assert "Stein/stderr  0 after the affine Stein correction (exact by construction" in headline(
        ds, "out.zarr"
    )
    assert "chosen estimate: 0 (by construction)" in plot_responses(ds).get_suptitle()
    # a residual that is not 0 is printed as a number, in the table and in the headline
    ds["stein_residual"] = ds["stein_residual"] * 0 + 0.02
    header, row = stein_table(summary(ds))
    assert row.split()[2:4] == ["0.02", "2"] and "by construction" not in row
    assert "Stein/stderr  2 (the largest" in headline(ds, "out.zarr")
    # an estimator exact before the correction too (score matching, A = x): both columns say so
    ds["stein_residual_uncorrected"] = ds["stein_residual"] * 0 + 2.9e-13
    ds["stein_residual"] = ds["stein_residual"] * 0 + 4.55e-14
    header, row = stein_table(summary(ds))
    assert row.count("0 (by construction)") == 2 and "e-13" not in row
    assert "Stein/stderr  0 by construction (this estimator" in headline(ds, "out.zarr")


def test_the_time_unit_is_shown_where_the_result_has_one():
    ds = analytic_result().assign_attrs(time_units="s", n_samples=100, chains=1)
    assert "100 samples, dt 0.05 s)" in summary(ds)
    axis = plot_responses(ds).axes[0].get_xlabel()
    assert axis == "time lag t (dt = 0.05 s)"
    assert "the data's time unit" in plot_responses(analytic_result()).axes[0].get_xlabel()


def test_the_report_lists_the_warnings_the_estimate_raised():
    """Every line of ``attrs["warnings"]`` is a row of the table (class and message), and a
    result without any says so."""
    lines = [
        "EdgeWarning: component 'x1': its density does not vanish at its lower edge 0",
        "SensitivityWarning: the response moves by 6.7 total standard errors",
    ]
    text = summary(analytic_result().assign_attrs(warnings="\n".join(lines)))
    rows = [line for line in text.splitlines() if line.startswith("warning ")]
    assert [row.split(None, 1)[1] for row in rows] == lines
    quiet = summary(analytic_result().assign_attrs(warnings=""))
    assert [line.split() for line in quiet.splitlines() if line.startswith("warning")] == [
        ["warning", "none"]
    ]


def test_a_criteria_panel_of_zeros_says_so_without_a_matplotlib_warning(ou_result):
    """No sample rejected at any order: the rejection panel is linear with a note instead of
    an empty log axis (whose matplotlib warning would reach the terminal)."""
    import warnings

    from kelr_dist.edges.report import plot_criteria

    ds = open_result(ou_result / "result.zarr")
    ds["rejection"] = ds["rejection"] * 0.0
    ds["rejection_paper"] = ds["rejection_paper"] * 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_criteria(ds)
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("R_M"))
    assert panel.get_yscale() == "linear"
    assert [t.get_text() for t in panel.texts] == ["every value is 0 here"]
    assert fig.axes[0].get_yscale() == "log"


def candidates(chosen: int, **attrs) -> xr.Dataset:
    """A result's candidate table alone: one kernel-embedding order, score matching at degrees
    1-3 with two ridges at degree 1 (the chosen ridge not the lower loss there)."""
    return xr.Dataset(
        {
            "candidate_estimator": ("candidate", ["kernel-embedding"] + ["score-matching"] * 4),
            "candidate_order": ("candidate", [13, 1, 1, 2, 3]),
            "candidate_ridge": ("candidate", [np.nan, 0.0, 1e-6, 0.0, 0.0]),
            "candidate_loss": ("candidate", [-0.9, -1.0, -1.01, -0.99, 40.0]),
            "candidate_loss_stderr": ("candidate", [0.01] * 5),
            "candidate_chosen": ("candidate", np.arange(5) == chosen),
        },
        attrs=attrs,
    )


def _stars(ax) -> list[tuple[float, float, str]]:
    return [
        (float(line.get_xdata()[0]), float(line.get_ydata()[0]), str(line.get_markerfacecolor()))
        for line in ax.get_lines()
        if line.get_marker() == "*"
    ]


def test_selection_stars_score_matchings_degree_and_says_when_one_order_was_fitted():
    """The chosen degree is starred even where another ridge of it had the lower loss; with the
    kernel embedding chosen, score matching's own pick gets an open star; a single fitted order
    is said in words, and a symlog loss axis has plain tick labels."""
    from kelr_dist.edges.report import plot_selection

    fig = plot_selection(candidates(1, degree=1, ridge=0.0))
    ke, sm = fig.axes[:2]
    assert _stars(sm) == [(1.0, -1.0, "red")]
    assert "only one order fitted (M = 13)" in " ".join(t.get_text() for t in ke.texts)
    assert [float(t) for t in ke.get_xticks()] == [13.0]
    labels = [t.get_text() for t in ke.get_yticklabels()]
    assert labels and not any("^" in text for text in labels), labels  # no 10^k mathtext
    fig = plot_selection(candidates(0, degree=1, ridge=0.0))
    ke, sm = fig.axes[:2]
    assert _stars(ke) == [(13.0, -0.9, "red")]
    assert _stars(sm) == [(1.0, -1.0, "none")]


def test_many_observables_are_drawn_as_heat_maps_and_moments_in_their_own_units():
    """A PDF estimate's response figure is a heat map per observed component and forcing (not a
    line panel per bin); moments are titled and labelled in their own units, an exceedance as
    the probability it is; the errors against the exact FDT are one column for them."""
    import json

    from kelr_dist.edges.report import entry_labels

    model = make_model("ou")
    rng = np.random.default_rng(3)
    x, _ = model.advance(model.initial_state(rng), 20_000, rng)
    common = {"dt": model.dt, "max_lag": 10, "score": model.score, "exact": True}
    common |= {"estimator": "score-matching", "degree": 1, "client": "synchronous"}
    pdf = estimate_response(x, observable="pdf(bins=12)", **common)
    fig = plot_responses(pdf)
    maps = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in maps) == [
        f"density of {c}, forcing on {j}" for c in ("x1", "x2") for j in ("x1", "x2")
    ]
    assert all(ax.collections for ax in maps)  # a heat map each
    assert fig.get_size_inches()[1] < 10
    moments = estimate_response(x, observable="moments", **common)
    titles = {ax.get_title(): ax.get_ylabel() for ax in plot_responses(moments).axes}
    assert titles["variance of x1; forcing x2"] == (
        "variance of x1\nper unit forcing (units of x1^2)"
    )
    assert "mean of x2; forcing x1" in titles
    table = summary(moments)
    assert "every entry" in table and "off-diagonal" not in table
    exceedance = xr.Dataset(attrs={"distribution": json.dumps({"kind": "exceedance"})})
    assert entry_labels(exceedance, "x1:exceed0.99", "x1") == (
        "P(x1 > q0.99)", "P(x1 > q0.99)\nper unit forcing (probability)"
    )  # fmt: skip


def test_a_response_of_many_components_is_drawn_as_maps_at_three_lags_and_its_diagonal():
    """64 components: k_ij at three lags as maps and the 64 diagonal entries with their band,
    not 64² line panels."""
    d, time = 64, np.arange(41) * 0.05
    coupling = 0.1 * np.random.default_rng(0).standard_normal((d, d)) + np.eye(d)
    k = np.exp(-time)[:, None, None] * coupling
    names = [f"x{n + 1}" for n in range(d)]
    dims = ("lag", "i", "j")
    ds = xr.Dataset(
        {"response": (dims, k), "response_stderr": (dims, np.full(k.shape, 0.02))},
        coords={"lag": np.arange(41), "time": ("lag", time), "i": names, "j": names},
        attrs={"dt": 0.05, "estimator": "score-matching"},
    )
    fig = plot_responses(ds)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert titles[:3] == ["k_ij at t = 0", "k_ij at t = 0.5", "k_ij at t = 1"]
    assert titles[3:] == [f"k[{n}, {n}](t)" for n in names]
    diagonal = next(ax for ax in fig.axes if ax.get_title() == "k[x7, x7](t)")
    assert diagonal.collections  # its ±2 stderr band


def lattice_result(shape, lattice, n_lags=41, exact=False):
    """A result-shaped Dataset on a periodic lattice whose response decays with the distance and
    differs from pair to pair (a random part), with random standard errors."""
    from kelr_dist.edges.report import lattice_distances

    d = int(np.prod(shape))
    time = np.arange(n_lags) * 0.05
    rng = np.random.default_rng(1)
    distance = lattice_distances(shape)
    spread = np.exp(-distance[None] / (0.5 + time[:, None, None]))
    k = np.exp(-time)[:, None, None] * spread + 0.01 * rng.standard_normal((n_lags, d, d))
    dims = ("lag", "i", "j")
    names = [f"x{n}" for n in range(d)]
    data = {
        "response": (dims, k),
        "response_stderr": (dims, 0.01 + 0.01 * rng.random(k.shape)),
        "response_total_stderr": (dims, 0.02 + 0.01 * rng.random(k.shape)),
    }
    if exact:
        data["response_exact"] = (dims, np.exp(-time)[:, None, None] * spread)
    return xr.Dataset(
        data,
        coords={"lag": np.arange(n_lags), "time": ("lag", time), "i": names, "j": names},
        attrs={"dt": 0.05, "estimator": "score-matching", "lattice": lattice},
    )


def _profile_by_hand(k, s, positions, period):
    """Means of ``k (lag, d, d)`` and of ``s`` over the pairs at each periodic distance, from the
    sites' positions ``(d, axes)`` by explicit loops over the pairs."""
    sums, errors, counts = {}, {}, {}
    for i in range(len(positions)):
        for j in range(len(positions)):
            r = sum(
                min(abs(a - b), n - abs(a - b))
                for a, b, n in zip(positions[i], positions[j], period, strict=True)
            )
            sums[r] = sums.get(r, 0.0) + k[:, i, j]
            errors[r] = errors.get(r, 0.0) + s[:, i, j]
            counts[r] = counts.get(r, 0) + 1
    order = sorted(counts)
    mean = np.stack([sums[r] / counts[r] for r in order], axis=1)
    return order, mean, np.stack([errors[r] / counts[r] for r in order], axis=1)


@pytest.mark.parametrize(
    ("shape", "lattice", "positions"),
    [
        ((12,), "ring(12)", [(n,) for n in range(12)]),
        ((4, 4), "grid(4,4)", [(a, b) for a in range(4) for b in range(4)]),
    ],
)
def test_a_declared_lattice_gets_the_response_against_its_distance(
    tmp_path, shape, lattice, positions
):
    """On a ring or a grid: one line per lag over the distances 0..max, each point the mean of
    k_ij over the pairs at that distance and its band ±2 x the mean of their total stderr."""
    from kelr_dist.edges.report import plot_lattice_response, shown_lags

    ds = lattice_result(shape, lattice)
    written = write_figures(ds, tmp_path)
    assert "response_distance.png" in [p.name for p in written]
    assert (tmp_path / "response_distance.png").read_bytes()[:8] == PNG_SIGNATURE
    order, mean, band = _profile_by_hand(
        ds["response"].values, ds["response_total_stderr"].values, positions, shape
    )
    assert order == list(range(sum(n // 2 for n in shape) + 1))  # ring(12): 0..6
    fig = plot_lattice_response(ds)
    (ax,) = fig.axes
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    lags = shown_lags(ds.sizes["lag"])
    assert [line.get_label() for line in lines] == [f"t = {ds.time.values[t]:.3g}" for t in lags]
    for line, lag in zip(lines, lags, strict=True):
        np.testing.assert_array_equal(line.get_xdata(), order)
        np.testing.assert_allclose(line.get_ydata(), mean[lag], rtol=1e-12)
    for fill, lag in zip(ax.collections, lags, strict=True):  # the band of each lag
        vertices = fill.get_paths()[0].vertices
        for r in order:
            at = np.sort(vertices[vertices[:, 0] == r, 1])
            edges = mean[lag, r] + 2 * band[lag, r] * np.array([-1.0, 1.0])
            np.testing.assert_allclose(at[[0, -1]], edges, rtol=1e-12)
    assert (
        lattice in fig.texts[0].get_text() and "against lattice distance" in fig.texts[0].get_text()
    )
    assert ax.get_xlabel().startswith("lattice distance r") and "units of A_i" in ax.get_ylabel()


def test_no_lattice_no_distance_figure(tmp_path):
    """Without a declared lattice, or on a response that is not square over its sites, no
    response_distance.png."""
    from kelr_dist.edges.report import plot_lattice_response

    ds = lattice_result((12,), "ring(12)")
    assert plot_lattice_response(ds.assign_attrs(lattice="ring(16)")) is None  # other size
    assert plot_lattice_response(ds.isel(i=slice(0, 6))) is None
    del ds.attrs["lattice"]
    assert plot_lattice_response(ds) is None
    assert "response_distance.png" not in [p.name for p in write_figures(ds, tmp_path)]


@pytest.mark.filterwarnings("ignore::UserWarning")  # few samples: the checks' warnings
def test_an_estimate_on_a_declared_ring_or_a_store_grid_records_its_lattice(tmp_path):
    """neighbours="ring" (the option) and a field store's neighbours="grid(4,4)" (its
    attribute) are recorded as attrs["lattice"], which the report reads to draw
    response_distance.png (a field's result on its components); found neighbourhoods record
    none."""
    from kelr_dist.edges.report import lattice_shape, plot_lattice_response

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4000, 16))
    x += 0.5 * np.roll(x, 1, axis=1)  # neighbours on the ring are correlated
    common = {"estimator": "score-matching", "max_lag": 3, "degree": 1, "client": "synchronous"}
    ring = estimate_response(x[:, :8], neighbours="ring", dt=0.1, progress=False, **common)
    assert ring.attrs["lattice"] == "ring(8)" and lattice_shape(ring) == (8,)
    store = tmp_path / "grid.zarr"  # a field on a 4 x 4 grid, its neighbours an attribute
    field = x.reshape(-1, 4, 4)
    xr.Dataset(
        {"x": (("time", "lat", "lon"), field)},
        coords={"time": np.arange(len(x)) * 0.1, "lat": np.arange(4.0), "lon": np.arange(4.0)},
        attrs={"neighbours": "grid(4,4)"},
    ).to_zarr(store, consolidated=False)
    grid = estimate_response(store, progress=False, **common)
    assert grid.attrs["lattice"] == "grid(4,4)" and "i_lat" in grid.dims
    profile = plot_lattice_response(grid).axes[0].get_lines()[0]
    np.testing.assert_array_equal(profile.get_xdata(), [0, 1, 2, 3, 4])
    write_result(grid, tmp_path / "result.zarr")
    written = write_figures(open_result(tmp_path / "result.zarr"), tmp_path / "figures")
    assert "response_distance.png" in [p.name for p in written]
    found = estimate_response(x[:, :8], index_set="local", dt=0.1, progress=False, **common)
    assert "lattice" not in found.attrs  # neighbourhoods from the partial correlations
