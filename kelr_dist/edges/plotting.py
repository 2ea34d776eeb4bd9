"""Matplotlib figures, imported when one is drawn: matplotlib is the optional ``plot`` extra."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INSTALL = 'pip install "kelr_dist[plot]"'


def new_figure(**kwargs: Any) -> Figure:
    """``matplotlib.figure.Figure(**kwargs)``, or an ImportError that says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            f"the figures need matplotlib, which is not installed: {INSTALL}"
        ) from error
    return Figure(**kwargs)
