"""kelr_dist: kernel-embedding linear response from long equilibrium trajectories.

The public API is re-exported here; see ``docs/architecture.md`` for the module map.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kelr_dist")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = ["__version__"]
