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

from kelr_dist.allocator import tune_allocator  # noqa: E402

tune_allocator()  # once per process, workers included (they import the package with a kernel)

from kelr_dist import analysis  # noqa: E402  (registers the Dataset.kelr accessor)
from kelr_dist.analysis import predict_response, ramp, sampled, step, susceptibility  # noqa: E402
from kelr_dist.bases import Coordinate, Hermite, Laguerre, TensorBasis  # noqa: E402
from kelr_dist.cluster import ClusterError, close_embedded_cluster, get_client  # noqa: E402
from kelr_dist.density import KernelDensity  # noqa: E402
from kelr_dist.estimate import (  # noqa: E402
    density_from_result,
    estimate_response,
    write_result,
)
from kelr_dist.models import MODEL_NAMES, make_model  # noqa: E402
from kelr_dist.moments import fit_basis, format_basis  # noqa: E402
from kelr_dist.response import Forcing, Observable  # noqa: E402
from kelr_dist.selection import Criteria, choose_delta, choose_order  # noqa: E402
from kelr_dist.simulate import simulate  # noqa: E402
from kelr_dist.store import TrajectoryError, describe_trajectory, open_trajectory  # noqa: E402

__all__ = [
    "MODEL_NAMES",
    "ClusterError",
    "Coordinate",
    "Criteria",
    "Forcing",
    "Hermite",
    "KernelDensity",
    "Laguerre",
    "Observable",
    "TensorBasis",
    "TrajectoryError",
    "__version__",
    "analysis",
    "choose_delta",
    "choose_order",
    "close_embedded_cluster",
    "density_from_result",
    "describe_trajectory",
    "estimate_response",
    "fit_basis",
    "format_basis",
    "get_client",
    "make_model",
    "open_trajectory",
    "predict_response",
    "ramp",
    "sampled",
    "simulate",
    "step",
    "susceptibility",
    "write_result",
]
