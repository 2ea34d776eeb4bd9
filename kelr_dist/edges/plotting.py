"""Matplotlib figures, imported when one is drawn: matplotlib is the optional ``plot`` extra.

Every function of the package that draws makes its figure with :func:`new_figure`, so without
matplotlib each raises the one :class:`PlotExtraError` that says what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INSTALL = 'pip install "kelr-dist[plot]"'


class PlotExtraError(ImportError):
    """A figure was asked for without matplotlib, the ``plot`` extra, installed."""


def require_matplotlib() -> None:
    """Raise :class:`PlotExtraError` unless matplotlib can be imported (a command that writes
    figures asks before its work)."""
    try:
        import matplotlib.figure  # noqa: F401 - imported to see that it can be
    except ImportError as error:
        raise PlotExtraError(
            f"the figures need matplotlib, which is not installed: {INSTALL}"
        ) from error


def new_figure(**kwargs: Any) -> Figure:
    """``matplotlib.figure.Figure(**kwargs)``, or :class:`PlotExtraError` that says how to
    install it."""
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(**kwargs)
