"""The README runs: every code block a reader runs, in the order a reader meets it, verbatim.

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

README = Path(__file__).resolve().parents[1] / "README.md"
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
