"""The README runs: every code block a reader runs, in the order a reader meets it, verbatim;
it is a front page of at most 400 lines with the sections a newcomer needs, its commands are the
ones CI runs, and nothing users read speaks of how the package was developed.

Bash blocks (``kelr ...``, ``python ...``) and Python blocks are extracted from README.md and run
in one fresh folder with the installed package, real files, no mocks: each Python block is saved
as a script and run with ``python block_NN.py`` (the quickstart starts an embedded cluster, whose
spawned workers need a ``__main__`` file), each bash block with ``bash -e``. Skipped: blocks that
install the package (the set-up commands: ``pip install``) and blocks preceded by the marker
``<!-- not-run -->`` (illustrative ones that need a cluster, certificates or your own store).
Other fences (``text``, ``yaml``) are not commands.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 400
#: the front page's sections, in order
SECTIONS = [
    "Set-up", "Python quickstart", "Post-analysis with xarray", "Inputs",
    "Command line and job files", "Running on a cluster", "Reading the report", "Accuracy",
    "Speed", "Documentation",
]  # fmt: skip
#: how a development diary reads: issue numbers, numbered work periods, blocked targets
DIARY = re.compile(r"\bissues? #?\d+|\bsessions?\b|\bwork periods?\b|\bblocked\b", re.IGNORECASE)
NOT_RUN = "<!-- not-run -->"
TIMEOUT = 600
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of the blocks the test runs, in README order."""
    blocks = []
    for match in _FENCE.finditer(text):
        language, code = match.group(1), match.group(2)
        if language not in ("bash", "python"):
            continue
        before = text[: match.start()].rstrip().splitlines()
        if before and before[-1].strip() == NOT_RUN:
            continue
        if language == "bash" and "pip install" in code:
            continue  # the set-up commands
        blocks.append((language, code))
    return blocks


def test_the_readme_blocks_are_found():
    blocks = runnable_blocks(README.read_text())
    languages = [language for language, _ in blocks]
    assert languages.count("python") >= 3 and languages.count("bash") >= 2
    assert any("kelr report" in code for _, code in blocks)


@pytest.mark.slow
def test_the_readme_runs_in_order(tmp_path):
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    env.pop("PYTHONPATH", None)  # the installed package, not a checkout on the path
    for number, (language, code) in enumerate(runnable_blocks(README.read_text())):
        if language == "python":
            script = tmp_path / f"block_{number:02d}.py"
            script.write_text(code)
            argv = [sys.executable, script.name]
        else:
            argv = ["bash", "-e", "-c", code]
        run = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
        where = f"README block {number} ({language}):\n{code}\nstdout:\n{run.stdout}\n"
        assert run.returncode == 0, f"{where}stderr:\n{run.stderr}"
        assert "Traceback" not in run.stderr, f"{where}stderr:\n{run.stderr}"
        # the package's own files open without zarr/xarray warnings
        for noise in ("UnstableSpecificationWarning", "consolidated metadata"):
            assert noise not in run.stderr, f"{where}stderr:\n{run.stderr}"
    assert (tmp_path / "runs" / "quick-response.zarr").is_dir()


def test_the_readme_is_a_front_page():
    """At most 400 lines, its sections in order, one accuracy and one speed table each with the
    command that regenerates it, and links to the documentation."""
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert [h for h in headings if h in SECTIONS] == SECTIONS
    for section, command in (
        ("Accuracy", "python scripts/accuracy_suite.py"),
        ("Speed", "python scripts/bench_pipeline.py --only speed"),
    ):
        body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        assert command in " ".join(body.split()), section
        assert body.count("\n|---") == 1, f"{section}: one table"
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).exists(), page


def test_the_readme_commands_are_the_ones_ci_runs():
    """The set-up's test command and the documentation build command are what .ci/run runs."""
    text = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    setup = [code for language, code in _FENCE.findall(text) if language == "bash"]
    tests = next(c for c in setup if "pytest" in c and "pip install" in c)
    assert tests.split("&& ", 2)[2].strip() in ci  # pip install -e ".[test]" && ruff ... pytest
    docs = next(c for c in setup if "sphinx-build" in c)
    assert docs.strip() in ci


def test_the_docs_index_sets_up_as_the_readme_does():
    """The documentation's front page gives the README's set-up command, verbatim."""
    readme = [c for language, c in _FENCE.findall(README.read_text()) if language == "bash"]
    index = [c for language, c in _FENCE.findall((ROOT / "docs" / "index.md").read_text())
             if language == "bash"]  # fmt: skip
    assert readme[0].strip() in [c.strip() for c in index]


def _user_texts() -> dict[str, str]:
    """What users read: the README, the documentation's pages and examples, the package's
    docstrings and messages, and the scripts' --help (their module docstrings and arguments)."""
    texts = {"README.md": README.read_text()}
    for path in (ROOT / "docs").rglob("*"):
        parts = path.relative_to(ROOT / "docs").parts
        if parts[0] in ("_build", "auto_examples") or path.suffix not in (".md", ".py", ".txt"):
            continue
        texts[str(path.relative_to(ROOT))] = path.read_text()
    for folder in ("kelr_dist", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            texts[str(path.relative_to(ROOT))] = path.read_text()
    return texts


def test_nothing_users_read_is_a_development_diary():
    """No issue numbers, numbered work periods or blocked targets in the README, the docs (the
    changelog is where history goes), the package or the scripts."""
    found = [
        f"{name}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)!r}"
        for name, text in _user_texts().items()
        for m in DIARY.finditer(text)
    ]
    assert not found, "development diary in what users read:\n" + "\n".join(found)
    assert DIARY.search("issue 10 is marked blocked") and DIARY.search("in the ninth session")


def test_the_api_reference_documents_every_public_function_and_warning():
    """Every public function and every warning class of ``kelr_dist`` that users call or see
    has an entry in docs/api.md, and the docs build fails on a broken cross-reference
    (``nitpicky``; the build runs with ``-W``)."""
    import kelr_dist

    api = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"\.\. auto(?:function|class|data):: kelr_dist\.(\w+)", api))
    wanted = {
        name
        for name in kelr_dist._EXPORTS
        if name.endswith("Warning")
        or name in ("predict_distribution", "distribution_response", "write_result")
    }
    assert wanted <= documented, sorted(wanted - documented)
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert re.search(r"^nitpicky = True$", conf, re.MULTILINE)
    from kelr_dist.pipeline.result import write_result

    assert "Parameters\n    ----------" in (write_result.__doc__ or "")
