"""kelr_dist: kernel-embedding linear response from long equilibrium trajectories.

The main entry points::

    kelr_dist.simulate(model, path, n_samples, ...)      # a trajectory store
    kelr_dist.open_trajectory(path)                      # validate a store
    kelr_dist.estimate_response(path_or_array, ...)      # the response k(lag, i, j)

See ``docs/architecture.md`` for the module map. Importing the package registers the
``Dataset.kelr`` accessor (:mod:`kelr_dist.analysis`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kelr_dist")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

from kelr_dist import analysis  # noqa: E402  (registers the Dataset.kelr accessor)

#: public name -> defining module; imported on first use (PEP 562), so that worker processes,
#: which import the package to unpickle a kernel, load only the modules that kernel needs
_EXPORTS = {
    "predict_response": "analysis",
    "ramp": "analysis",
    "sampled": "analysis",
    "step": "analysis",
    "susceptibility": "analysis",
    "Coordinate": "bases",
    "Hermite": "bases",
    "Laguerre": "bases",
    "TensorBasis": "bases",
    "ClusterError": "cluster",
    "close_embedded_cluster": "cluster",
    "get_client": "cluster",
    "KernelDensity": "density",
    "density_from_result": "estimate",
    "estimate_response": "estimate",
    "write_result": "estimate",
    "MODEL_NAMES": "models",
    "make_model": "models",
    "fit_basis": "moments",
    "format_basis": "moments",
    "Forcing": "response",
    "Observable": "response",
    "Criteria": "selection",
    "choose_delta": "selection",
    "choose_order": "selection",
    "simulate": "simulate",
    "TrajectoryError": "store",
    "describe_trajectory": "store",
    "open_trajectory": "store",
}

__all__ = ["__version__", "analysis", *sorted(_EXPORTS)]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        from importlib import import_module

        value = getattr(import_module(f"kelr_dist.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kelr_dist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
