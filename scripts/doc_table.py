"""Markdown tables for the documentation's benchmarks page, written by the scripts that measure
them (``--output docs/benchmarks/NAME.md``); the page includes each file as it is."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def machine() -> str:
    """The machine a table was measured on: cores, processor and the 1-minute load average."""
    return (
        f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"load {os.getloadavg()[0]:.1f} at the end"
    )


def write_table(
    path: Path, header: Sequence[str], rows: Sequence[Sequence[str]], note: str = ""
) -> None:
    """Write a Markdown table to ``path`` with the command that made it, the date and the
    machine below it (and ``note``, one paragraph)."""
    command = shlex.join(["python", *sys.argv])
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        f"Written by `{command}` on {time.strftime('%Y-%m-%d')} ({machine()}).",
    ]
    if note:
        lines += ["", note]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
