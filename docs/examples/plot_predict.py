"""
Predicting the response to a forcing
====================================

Estimate the response of an Ornstein--Uhlenbeck process given as a plain numpy array, then
use the ``Dataset.kelr`` accessor to predict the change of the mean under a step forcing
(eq. 4) with its error band, and compare with the exact answer :math:`e^{-\\Gamma t}`.
"""

# %%
# A numpy array has no sample interval of its own: ``dt=`` gives it, and ``max_time`` is then
# in the same unit. Its components are unnamed, so they are ``x1, x2`` -- as in a store.
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from scipy.linalg import expm

import kelr_dist

if __name__ == "__main__":
    folder = Path(tempfile.mkdtemp())
    kelr_dist.simulate("ou", folder / "ou.zarr", n_samples=100_000, seed=4)
    trajectory = kelr_dist.open_trajectory(folder / "ou.zarr")
    x, dt = trajectory.values[0], trajectory.attrs["dt"]  # a (time, component) array
    ds = kelr_dist.estimate_response(x, dt=dt, max_time=4, n_workers=1, progress=False)
    print(ds.attrs["estimator"], ds.i.values.tolist())

# %%
# A step of size 0.1 on component ``x1`` from t = 0: the predicted change of the mean of each
# component, with ±2 standard errors, against the exact linear response of the OU process.
if __name__ == "__main__":
    forcing = kelr_dist.step(0.1, ds.time.values, j="x1")
    change = ds.kelr.predict(forcing)
    model = kelr_dist.make_model("ou")
    drift = model.gamma
    t = ds.time.values
    exact = np.array(
        [0.1 * (np.linalg.solve(drift, np.eye(2) - expm(-drift * s)))[:, 0] for s in t]
    )
    fig, ax = plt.subplots(figsize=(7, 4))
    for c, name in enumerate(change.i.values):
        m, se = change.sel(i=name), change.stderr.sel(i=name)
        ax.fill_between(t, m - 2 * se, m + 2 * se, color=f"C{c}", alpha=0.3, lw=0)
        ax.plot(t, m, color=f"C{c}", label=f"ΔE[{name}](t), estimated")
        ax.plot(t, exact[:, c], "--", color=f"C{c}", label=f"ΔE[{name}](t), exact")
    ax.set_title("a step of forcing δf = 0.1 on x1 from t = 0; bands ±2 total standard errors")
    ax.set_xlabel("time after the step (the model's time unit)")
    ax.set_ylabel("change of the mean (data units)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()
