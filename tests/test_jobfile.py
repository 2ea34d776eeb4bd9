"""Job files: schema validation with key paths, path resolution, observable/forcing references."""

import textwrap

import numpy as np
import pytest

from kelr_dist.edges.jobfile import JobError, load_job, parse_job
from kelr_dist.kernels.observables.builtin import linear_forcing, square
from kelr_dist.pipeline.options import EstimateOptions, OptionsError, PatternFile, checked

MINIMAL = {"input": {"store": "data/traj.zarr"}, "outputs": {"result": "out/result.zarr"}}


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def with_(section, key, value):
    """MINIMAL with ``section.key = value`` (``key=None``: the section itself)."""
    document = {k: dict(v) for k, v in MINIMAL.items()}
    if key is None:
        document[section] = value
    else:
        document.setdefault(section, {})[key] = value
    return document


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``kelr_user_funcs`` on sys.path with an observable, a forcing and a constant."""
    (tmp_path / "kelr_user_funcs.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def pair(x):
                return np.stack([x[:, 0] * x[:, 1], x[:, 0] + 1.0], axis=1)

            def tanh_forcing(x):
                return np.tanh(x), 1.0 / np.cosh(x) ** 2

            class Holder:
                @staticmethod
                def first(x):
                    return x[:, 0]

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "kelr_user_funcs"


def test_full_job_resolves_paths_against_the_job_folder(tmp_path, user_module):
    folder = tmp_path / "jobs"
    folder.mkdir()
    path = write(
        folder,
        """
        input: {store: ../data/tw.zarr, variable: u}
        basis: {spec: "laguerre(theta=1),hermite", order: [9, 0], max_order: [12, 2],
                index_set: box}
        observable: {function: "kelr_user_funcs:pair", names: [product, shifted]}
        forcing: "kelr_user_funcs:tanh_forcing"
        lags: {max_time: 2.5}
        delta: 1.0e-7
        baselines: {exact: true, kde: true, gaussian: false}
        outputs: {result: out/r.zarr, netcdf: out/r.nc, figures: out/figures, overwrite: true}
        cluster: {workers: 2, memory_limit: 1GiB}
        """,
    )
    job = load_job(path)
    assert job.store == folder / "../data/tw.zarr"
    assert job.result == folder / "out/r.zarr"
    assert job.netcdf == folder / "out/r.nc" and job.figures == folder / "out/figures"
    options, cluster = job.options, job.cluster
    assert (options.order, options.max_order, options.index_set) == ((9, 0), (12, 2), "box")
    assert (options.max_lag, options.max_time, options.delta) == (None, 2.5, 1e-7)
    assert (options.exact, options.kde, options.gaussian) == (True, True, False)
    assert job.files.overwrite is True
    assert (cluster.scheduler, cluster.workers, cluster.memory_limit) == (None, 2, "1GiB")

    assert options.variable == "u" and options.basis == "laguerre(theta=1),hermite"
    x = np.array([[1.0, 2.0], [-0.5, 3.0]])
    observable, forcing = options.observable_for(["x1", "x2"]), options.forcing_for(["x1", "x2"])
    assert observable.names == ("product", "shifted")
    np.testing.assert_array_equal(observable(x), [[2.0, 2.0], [-1.5, 0.5]])
    assert forcing.names == ("x1", "x2")
    score = np.ones_like(x)
    b = forcing.conjugate(x, score, np.ones(2, dtype=bool))
    np.testing.assert_allclose(b, -(1.0 / np.cosh(x) ** 2) - np.tanh(x))


def test_defaults_and_built_ins(tmp_path):
    job = parse_job(MINIMAL, tmp_path / "job.yaml")
    assert job.store == tmp_path / "data/traj.zarr" and job.options.variable == "x"
    # the job's defaults are the model's: one place for them
    assert job.options == EstimateOptions()
    assert job.netcdf is None and job.figures is None and job.cluster.scheduler is None
    assert not job.files.overwrite
    identity = job.options.observable_for(["a", "b"])
    assert identity.names == ("a", "b") and identity.function is None
    assert job.options.forcing_for(["a", "b"]).function is None  # constant

    job = parse_job({**MINIMAL, "observable": "square", "forcing": "linear"}, tmp_path / "j.yml")
    observable = job.options.observable_for(["a", "b"])
    x = np.array([[2.0, -3.0]])
    assert observable.names == ("a^2", "b^2")
    np.testing.assert_array_equal(observable(x), [[4.0, 9.0]])
    np.testing.assert_array_equal(square(x), x**2)
    c, dc = linear_forcing(x)
    np.testing.assert_array_equal(c, x)
    np.testing.assert_array_equal(dc, np.ones_like(x))


def test_a_pattern_file_is_taken_relative_to_the_job_folder(tmp_path):
    job = parse_job({**MINIMAL, "forcing": "pattern=inputs/sst.nc:bump"}, tmp_path / "job.yaml")
    assert isinstance(job.options.forcing, PatternFile)
    assert job.options.forcing.file == str(tmp_path / "inputs/sst.nc")
    assert job.options.forcing.variable == "bump"
    assert job.options.function_names()["forcing"] == "pattern"
    job = parse_job({**MINIMAL, "forcing": "pattern=/data/sst.zarr:bump"}, tmp_path / "job.yaml")
    assert job.options.forcing.file == "/data/sst.zarr"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (with_("basis", "order", "sixty"), "basis.order: expected 'auto' or a non-negative"),
        (with_("basis", "order", -1), "basis.order: expected 'auto'"),
        (with_("basis", "order", True), "basis.order: expected 'auto'"),
        (with_("basis", "max_order", "auto"), "basis.max_order: expected a non-negative integer"),
        (with_("basis", "spec", "hermit,hermite"), "basis.spec: basis spec entry 0 ('hermit')"),
        (with_("basis", "spec", "hermite(beta=0.1)"), "basis.spec: basis spec entry 0"),
        (with_("basis", "index_set", "cube"), "index_set: expected one of ['auto', 'total',"),
        (with_("basis", "orders", 3), "basis.orders: unknown key; allowed: spec, order"),
        (with_("lags", "max_lag", 1.5), "lags.max_lag: expected a non-negative integer"),
        (with_("lags", "max_time", "long"),
         "lags.max_time: expected a non-negative finite number, got 'long'"),
        ({**with_("lags", "max_lag", 5), "lags": {"max_lag": 5, "max_time": 1.0}},
         "give lags.max_lag or lags.max_time, not both"),
        (with_("basis", "order", [3, 0]) | {"basis": {"order": [3, 0], "index_set": "total"}},
         "a per-coordinate basis.order (3, 0) needs basis.index_set='box'"),
        (with_("estimator", "folds", True), "estimator.folds: expected an integer from 2 to 20"),
        (with_("estimator", "degree", 0),
         "estimator.degree: expected 'auto' or a positive integer, got 0"),
        (with_("estimator", "stein_correction", "no"), "stein_correction: expected true or"),
        (with_("baselines", "score", "no_such_module_kelr:f"),
         "baselines.score: cannot import module 'no_such_module_kelr'"),
        (with_("delta", None, "tiny"), "delta: expected 'auto', 'paper' or a positive finite"),
        (with_("delta", None, -1e-7), "delta: expected 'auto', 'paper' or a positive finite"),
        (with_("baselines", "exact", "yes"), "baselines.exact: expected true or false"),
        (with_("outputs", "figures", 3),
         "outputs.figures: expected a path (a non-empty string without NUL characters), got 3"),
        (with_("cluster", "workers", 0), "cluster.workers: expected a positive integer"),
        (with_("cluster", "memory_limit", "lots"), "cluster.memory_limit: expected a memory size"),
        ({**MINIMAL, "cluster": {"scheduler": "tcp://h:8786", "workers": 2}},
         "cluster.workers applies to the embedded cluster only, not with cluster.scheduler"),
        ({**MINIMAL, "inputs": {}}, "inputs: unknown key; allowed: input, estimator, basis"),
        ({"outputs": {"result": "r.zarr"}}, "input.store: required key is missing"),
        ({"input": {"store": "s.zarr"}}, "outputs.result: required key is missing"),
        (with_("basis", None, "auto"), "basis: expected a mapping of keys"),
        (
            with_("observable", None, "cube"),
            "observable: expected one of "
            "['identity', 'square', 'angles', 'pdf', 'moments', 'exceedance']",
        ),
        (with_("forcing", None, "quadratic"), "forcing: expected one of ['constant', 'linear']"),
        (with_("forcing", None, "pattern=sst.nc"), "forcing: expected 'pattern=FILE:VARIABLE'"),
        (with_("forcing", None, "pattern=:bump"), "forcing: expected 'pattern=FILE:VARIABLE'"),
        (["a", "list"], "expected a mapping of sections at the top level"),
    ],
)  # fmt: skip
def test_bad_values_name_the_file_and_key(tmp_path, document, message):
    with pytest.raises(JobError) as info:
        parse_job(document, tmp_path / "job.yaml")
    assert str(info.value).startswith("job.yaml: ")
    assert message in str(info.value)


def test_the_documented_example_message(tmp_path):
    path = write(tmp_path, "input: {store: s.zarr}\nbasis: {order: sixty}\n")
    with pytest.raises(JobError, match=r"^job\.yaml: basis\.order: expected 'auto' or a non-neg"):
        load_job(path)


@pytest.mark.parametrize(
    ("observable", "message"),
    [
        ("kelr_user_funcs:pair", "needs its component names"),
        ({"function": "kelr_user_funcs:pair"}, "'names' must be a non-empty list"),
        ({"function": "kelr_user_funcs:pair", "names": ["a", "a"]}, "distinct component names"),
        ({"function": "kelr_user_funcs:nope", "names": ["a"]}, "has no attribute 'nope'"),
        ({"function": "kelr_user_funcs:NOT_CALLABLE", "names": ["a"]}, "is not callable"),
        ({"function": "no_such_module_kelr:f", "names": ["a"]}, "cannot import module"),
        ({"function": "os.system('true')", "names": ["a"]}, "expected a reference"),
        ({"function": "kelr_user_funcs:pair", "names": ["a"], "code": 1}, "unknown key(s)"),
        ({"names": ["a"]}, "missing key 'function'"),
    ],
)
def test_observable_references_are_imported_never_evaluated(
    tmp_path, user_module, observable, message
):
    with pytest.raises(JobError) as info:
        parse_job({**MINIMAL, "observable": observable}, tmp_path / "job.yaml")
    assert str(info.value).startswith("job.yaml: observable: ")
    assert message in str(info.value)


def test_dotted_reference(tmp_path, user_module):
    job = parse_job(
        {**MINIMAL, "observable": {"function": "kelr_user_funcs:Holder.first", "names": ["f"]}},
        tmp_path / "job.yaml",
    )
    observable = job.options.observable_for(["x1", "x2"])
    np.testing.assert_array_equal(observable(np.array([[5.0, 1.0]])), [[5.0]])


def test_yaml_and_file_errors(tmp_path):
    with pytest.raises(JobError, match="cannot read the job file"):
        load_job(tmp_path / "missing.yaml")
    path = write(tmp_path, "input: {store: [unclosed\n")
    with pytest.raises(JobError, match=r"^job\.yaml: not valid YAML at line \d+, column \d+"):
        load_job(path)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", "auto"),
        (0, 0),
        (60, 60),
        ([90, 0], (90, 0)),
        ((3, 4), (3, 4)),
        (np.int64(7), 7),
        ("60", 60),
        ("90,0", (90, 0)),
    ],
)
def test_order_accepts(value, expected):
    assert checked(EstimateOptions, {"order": value, "index_set": "box"}).order == expected


@pytest.mark.parametrize("value", ["sixty", -1, 1.5, True, [], [1, -2], [1, "a"], None])
def test_order_rejects(value):
    with pytest.raises(OptionsError, match="^order: expected 'auto' or a non-negative integer"):
        checked(EstimateOptions, {"order": value})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", "auto"), ("paper", "paper"), (1e-7, 1e-7), (2, 2.0), ("1e-7", 1e-7)],
)
def test_delta(value, expected):
    assert checked(EstimateOptions, {"delta": value}).delta == expected
    for bad in (0, -1.0, float("nan"), float("inf"), "big", True):
        with pytest.raises(OptionsError, match="^delta: expected 'auto', 'paper' or a positive"):
            checked(EstimateOptions, {"delta": bad})


def test_components_are_a_key_of_the_input_section(tmp_path):
    job = parse_job(with_("input", "components", ["x2", "x1"]), tmp_path / "job.yaml")
    assert job.options.components == ("x2", "x1")
    assert parse_job(
        with_("input", "components", "x2, x1"), tmp_path / "job.yaml"
    ).options.components == ("x2", "x1")
    assert parse_job(MINIMAL, tmp_path / "job.yaml").options.components is None
    with pytest.raises(JobError, match=r"^job\.yaml: input\.components: expected component names"):
        parse_job(with_("input", "components", [1, 2]), tmp_path / "job.yaml")


def test_the_help_and_the_schema_name_the_distribution_observables():
    """``kelr estimate --help`` and the job-file schema (``kelr run --help``) list every built-in
    observable, the distribution ones with their parameters."""
    from click.testing import CliRunner

    from kelr_dist.edges.cli import main
    from kelr_dist.edges.jobfile import schema_yaml

    help_text = " ".join(CliRunner().invoke(main, ["estimate", "--help"]).output.split())
    schema = " ".join(line.partition("#")[2].strip() for line in schema_yaml().splitlines())
    for text in (help_text, schema):
        for name in ("'identity'", "'square'", "'angles'", "'pdf(bins=40", "'moments'"):
            assert name in text, (name, text)
        assert "'exceedance" in text.replace(" ", "")
