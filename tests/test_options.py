"""The one options model: the documented job-file schema and the ``--help`` of ``kelr estimate``
and ``kelr run`` agree with it, every field has one key in a job file, the module is pure, and
``kelr estimate --score package.module:function`` gives the exact-FDT reference."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from kelr_dist.edges.cli import cli_name, main
from kelr_dist.edges.jobfile import KEY_PATHS, LAYOUT, schema_yaml
from kelr_dist.pipeline.options import FIELDS, ClusterOptions, EstimateOptions, python_only

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
        if name == "forcing" or python_only(info):  # job files and Python, or Python only
            assert cli_name(name) not in text
            continue
        assert cli_name(name) in text, name
        extra = info.json_schema_extra or {}
        if extra.get("choices"):
            assert f"[{'|'.join(extra['choices'])}]" in text, name
        if info.default is not None and info.annotation is not bool:
            assert f"[default: {info.default}]" in text, name
        words = " ".join(str(info.description).split()[1:4])
        assert words in text, name
    assert "--no-stein-correction" in text


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
