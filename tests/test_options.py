"""The one options model: the documented job-file schema and the ``--help`` of ``kelr estimate``
and ``kelr run`` agree with it, every field has one key in a job file, the module is pure, and
``kelr estimate --score package.module:function`` gives the exact-FDT reference."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from kelr_dist.edges.cli import cli_name, main
from kelr_dist.edges.jobfile import KEY_PATHS, LAYOUT, JobError, parse_job, schema_yaml
from kelr_dist.kernels.scores.heldout import ESTIMATORS
from kelr_dist.kernels.scores.local import SYMMETRIES
from kelr_dist.pipeline.options import (
    FIELDS,
    INDEX_SETS,
    MODELS,
    ClusterOptions,
    EstimateOptions,
    OptionsError,
    checked,
    choices,
    python_name,
    python_only,
    shown,
)

CLI_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "cli.md"


def test_documented_job_schema_is_the_models():
    text = CLI_GUIDE.read_text()
    section = text[text.index("## Job files") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    assert block.group(1) == schema_yaml(), (
        "docs/guide/cli.md's job-file schema is out of date: replace it by the output of "
        "'python -m kelr_dist.edges.jobfile'"
    )


def test_schema_has_every_field_once_with_its_default_and_description():
    schema = schema_yaml()
    fields = {name: info for name, info in FIELDS.items() if not python_only(info)}
    keys = [KEY_PATHS[name] for name in fields]
    assert sorted(KEY_PATHS) == sorted(fields)  # every field has a key, every key a field
    assert len(set(keys)) == len(keys)
    for name, info in fields.items():
        key = KEY_PATHS[name].rsplit(".", 1)[-1]
        line = next(line for line in schema.splitlines() if line.strip().startswith(f"{key}:"))
        if not info.is_required():
            default = {None: "null", True: "true", False: "false"}.get(info.default, info.default)
            assert re.match(rf"\s*{key}: {re.escape(str(default))}\s+#", line), line
        words = " ".join(str(info.description).split()[:4])
        assert words in " ".join(schema.split()), name
    assert list(LAYOUT)[0] == "input"


def _help(*command):
    result = CliRunner().invoke(main, [*command, "--help"], prog_name="kelr")
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("model", [EstimateOptions, ClusterOptions])
def test_estimate_help_is_the_models(model):
    text = _help("estimate")
    for name, info in model.model_fields.items():
        if python_only(info):  # a keyword of the Python function alone
            assert cli_name(name) not in text
            continue
        assert cli_name(name) in text, name
        if choices(info):
            assert f"[{'|'.join(choices(info))}]" in text, name
        if info.default is not None and info.annotation is not bool:
            assert f"[default: {info.default}]" in text, name
        words = " ".join(str(info.description).split()[1:4])
        assert words in text, name
    assert "--no-stein-correction" in text


#: the command-line options that are no model field: how the command prints
COMMAND_ONLY = ("quiet", "help")


@pytest.mark.parametrize("command", ["estimate", "run"])
def test_every_command_line_option_is_one_model_field(command):
    """Each option of ``kelr estimate``/``kelr run`` is made from one field of the options
    model: its flag, its help (the field's description), no conversion of its own (the text
    goes to the model: a flag gives a bool)."""
    for param in main.commands[command].params:
        if not isinstance(param, click.Option) or param.name in COMMAND_ONLY:
            continue
        assert param.name in FIELDS, param.name
        info = FIELDS[param.name]
        assert not python_only(info), param.name
        assert param.opts == [cli_name(param.name)], param.opts
        description = str(info.description)
        assert param.help == description[0].upper() + description[1:] + ".", param.name
        text_or_flag = click.types.StringParamType | click.types.BoolParamType
        assert isinstance(param.type, text_or_flag), (param.name, param.type)


def _key_path(field):
    return KEY_PATHS[field]


#: a value each field refuses; every field has one (a new field needs one here)
BAD_VALUES = {
    "variable": "  ",
    "components": 3,
    "estimator": "neural",
    "degree": 0,
    "folds": 1,
    "stein_correction": "no",
    "pilot": 2,
    "basis": "chebyshev",
    "order": -1,
    "max_order": "auto",
    "index_set": "cube",
    "neighbours": "",
    "symmetry": "mirror",
    "observable": "cube",
    "forcing": "quadratic",
    "max_lag": 1.5,
    "max_time": float("inf"),
    "delta": 0,
    "exact": "yes",
    "score": "nothing",
    "kde": 1,
    "gaussian": "bool",
    "dt": -1.0,
    "reduce": "eof(0)",
    "scheduler": 3,
    "workers": 0,
    "memory_limit": "lots",
    "progress": "yes",
    "store": "",
    "result": "a\0b",
    "netcdf": 3,
    "figures": " ",
    "overwrite": "yes",
}
MODEL_OF = {name: model for model in MODELS for name in model.model_fields}
REQUIRED = {"store": "s.zarr", "result": "r.zarr"}


def test_every_field_has_a_bad_value():
    assert sorted(BAD_VALUES) == sorted(FIELDS)


@pytest.mark.parametrize("naming", [python_name, cli_name, _key_path])
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_each_bad_value_is_one_line_naming_the_option_and_the_value(field, naming):
    """The model refuses every field's bad value itself, in one line ``<option>: <problem>``
    with the option as the caller's users name it (Python keyword, command-line option, job-file
    key) and the value: nothing later (the engine, the store) has a check of its own."""
    if naming is not python_name and python_only(FIELDS[field]):
        pytest.skip("a keyword of the Python function alone")
    model, value = MODEL_OF[field], BAD_VALUES[field]
    values = {**{k: v for k, v in REQUIRED.items() if k in model.model_fields}, field: value}
    with pytest.raises(OptionsError) as info:
        checked(model, {python_name(field) if naming is python_name else field: value}
                | {k: v for k, v in values.items() if k != field}, naming)  # fmt: skip
    message = str(info.value)
    assert "\n" not in message and ";" not in message, message
    assert message.startswith(f"{naming(field)}: "), message
    if field not in ("basis", "score"):  # these quote the part of the value that is wrong
        assert message.endswith(f"got {shown(value)}"), message


def test_a_memory_limit_is_a_memory_size_before_any_cluster(tmp_path):
    """A memory limit dask cannot read was taken by the model and refused by the engine when it
    started the cluster, named as the Python keyword; now the model refuses it."""
    assert checked(ClusterOptions, {"memory_limit": " 2GiB "}).memory_limit == "2GiB"
    assert checked(ClusterOptions, {"memory_limit": 2**30}).memory_limit == 2**30
    for bad in ("lots", "0B", "", 0, -5, True, 2.5):
        with pytest.raises(OptionsError, match=r"^--memory-limit: expected a memory size"):
            checked(ClusterOptions, {"memory_limit": bad}, cli_name)


def test_a_choice_is_a_literal_of_the_kernels_names():
    assert choices(FIELDS["estimator"]) == ESTIMATORS
    assert choices(FIELDS["index_set"]) == INDEX_SETS
    assert choices(FIELDS["symmetry"]) == SYMMETRIES
    assert choices(FIELDS["folds"]) == ()


def test_run_help_ends_with_the_schema():
    text = _help("run")
    assert " ".join(schema_yaml().split()) in text


def test_the_options_module_is_pure():
    code = (
        "import sys, kelr_dist.pipeline.options; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'zarr')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- kelr estimate --score ------------------------------------------------------------------


@pytest.fixture
def user_store(tmp_path, monkeypatch):
    """A store of standard normal samples without a model attribute, and a module with its
    score ``-x`` on sys.path (and PYTHONPATH, for worker processes)."""
    data = np.random.default_rng(3).standard_normal((20_000, 2))
    names = np.array(["a", "b"], dtype=object)
    store = tmp_path / "mine.zarr"
    xr.Dataset(
        {"x": (("time", "component"), data)}, coords={"component": names}, attrs={"dt": 0.1}
    ).chunk({"time": 5000}).to_zarr(store, consolidated=False)
    (tmp_path / "kelr_user_score.py").write_text(
        textwrap.dedent(
            """
            def normal(x):
                return -x

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return store


def _kelr(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        main.main([str(a) for a in argv], prog_name="kelr")
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_score_gives_the_exact_reference_for_a_user_store(user_store, capsys):
    out = user_store.parent / "out.zarr"
    code, stdout, stderr = _kelr(
        capsys, "estimate", user_store, out, "--score", "kelr_user_score:normal",
        "--max-order", 4, "--max-lag", 10, "--scheduler", "synchronous", "--quiet",
    )  # fmt: skip
    assert code == 0, stderr
    ds = xr.open_zarr(out).load()
    # iid standard normal samples: the exact FDT with s = -x gives k(0) = cov = I, k(s > 0) = 0
    k = ds["response_exact"].values
    np.testing.assert_allclose(k[0], np.eye(2), atol=0.05)
    assert np.abs(k[1:]).max() < 5 * ds["response_exact_stderr"].values[1:].max()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_kelr:f", "--score: cannot import module 'no_such_module_kelr'"),
        ("kelr_user_score:nope", "--score: module 'kelr_user_score' has no attribute 'nope'"),
        ("kelr_user_score:NOT_CALLABLE", "--score: 'kelr_user_score:NOT_CALLABLE' is not callable"),
        ("__import__('os').system('true')", "--score: expected a reference"),
        ("kelr_user_score", "--score: expected a reference 'package.module:function'"),
    ],
)
def test_bad_score_specs_exit_2_with_one_line(user_store, capsys, spec, message):
    code, stdout, stderr = _kelr(capsys, "estimate", user_store, "out.zarr", "--score", spec)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kelr estimate: error: --score: ")
    assert message in lines[0] and "Traceback" not in stderr
    assert not (user_store.parent / "out.zarr").exists()


def test_exact_without_a_model_points_to_score(user_store, capsys):
    code, stdout, stderr = _kelr(
        capsys, "estimate", user_store, "out.zarr", "--exact", "--scheduler", "synchronous"
    )
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "needs the store's model" in stderr and "--score" in stderr


@pytest.mark.parametrize(
    "field", sorted(name for name, info in FIELDS.items() if not python_only(info))
)
def test_each_bad_value_in_a_job_file_is_one_line_naming_its_key(tmp_path, field):
    """The job file's sections are the same fields: a bad value under its key is the model's
    one line, named by the file and the key's path."""
    document = {"input": {"store": "s.zarr"}, "outputs": {"result": "r.zarr"}}
    section, _, key = KEY_PATHS[field].rpartition(".")
    if section:
        document.setdefault(section, {})[key] = BAD_VALUES[field]
    else:
        document[key] = BAD_VALUES[field]
    with pytest.raises(JobError) as info:
        parse_job(document, tmp_path / "job.yaml")
    message = str(info.value)
    assert "\n" not in message and ";" not in message, message
    assert message.startswith(f"job.yaml: {KEY_PATHS[field]}: "), message
