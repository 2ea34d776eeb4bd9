"""
The response of a field's area-weighted mean to a forcing pattern
=================================================================

A climate variable comes as ``(time, lat, lon)`` with a land mask. This example writes a small
synthetic field on a sphere to a netCDF file, opens it with xarray, and estimates the response
of its area-weighted mean (weights ``cos(lat)``) to a forcing pattern over the grid. The result
comes back on the grid: ``response(lag, i, j_lat, j_lon)`` is how much the forcing at each
sea point moves the mean, and ``pattern_response(lag, i)`` the response to the whole pattern.
"""

# %%
# The field: a damped, noisy anomaly that diffuses between neighbouring grid points (along
# longitude around each latitude circle, and between latitudes), sampled exactly every
# ``dt = 0.1`` as an AR(1) process. Land points are NaN at every time: the estimate drops them
# and names them in ``attrs["field_masked"]``.
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from scipy.linalg import expm

import kelr_dist

lat = np.array([-50.0, -15.0, 15.0, 50.0])
lon = np.array([0.0, 72.0, 144.0, 216.0, 288.0])
land = np.zeros((lat.size, lon.size), dtype=bool)
land[1:3, 1:3] = True  # a continent on the equator
land[0, 4] = land[3, 0] = land[3, 2] = land[0, 0] = True  # and some islands


def synthetic_field(n: int, dt: float, seed: int = 0) -> np.ndarray:
    """``(n, lat, lon)`` samples of ``dX = -G X dt + dW`` on the grid, land set to NaN."""
    size = lat.size * lon.size
    generator = np.eye(size)
    for a in range(lat.size):
        for b in range(lon.size):
            p = a * lon.size + b
            neighbours = [a * lon.size + (b + 1) % lon.size]
            if a + 1 < lat.size:
                neighbours.append((a + 1) * lon.size + b)
            for q in neighbours:
                generator[[p, q], [q, p]] -= 0.4
                generator[[p, q], [p, q]] += 0.4
    step = expm(-generator * dt)
    noise = np.random.default_rng(seed).standard_normal((n, size)) * np.sqrt(dt)
    x = np.zeros((n, size))
    for t in range(1, n):
        x[t] = step @ x[t - 1] + noise[t]
    field = x.reshape(n, lat.size, lon.size)
    field[:, land] = np.nan
    return field


if __name__ == "__main__":
    folder = Path(tempfile.mkdtemp())
    dt = 0.1
    tas = xr.DataArray(
        synthetic_field(20_000, dt),
        dims=("time", "lat", "lon"),
        coords={"time": np.arange(20_000) * dt, "lat": lat, "lon": lon},
        name="tas",
    )
    tas.to_dataset().to_netcdf(folder / "tas.nc")

# %%
# The forcing pattern: a bump centred at (50°N, 288°E), a DataArray over the same grid (its
# values over land are not used). The observable ``mean(weights=cos(lat))`` is the area-weighted
# mean over the sea points. Score matching (degree 1: the field is Gaussian) keeps this example
# fast (``estimator="auto"`` would also fit the kernel embedding), and a file this small is
# estimated in this process (``client="synchronous"``) rather than on a cluster.
if __name__ == "__main__":
    lat2, lon2 = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    centre = np.deg2rad([50.0, 288.0])
    cosine = np.sin(lat2) * np.sin(centre[0]) + np.cos(lat2) * np.cos(centre[0]) * np.cos(
        lon2 - centre[1]
    )
    pattern = xr.DataArray(
        np.exp(3.0 * (cosine - 1.0)), dims=("lat", "lon"), coords={"lat": lat, "lon": lon}
    )
    with xr.open_dataset(folder / "tas.nc") as field:
        ds = kelr_dist.estimate_response(
            field,
            variable="tas",
            observable="mean(weights=cos(lat))",
            forcing=pattern,
            estimator="score-matching",
            degree=1,
            max_time=3.0,
            client="synchronous",
            progress=False,
        )
    print(ds["response"].dims, ds.attrs["field_masked"])

# %%
# Left: the pattern. Middle and right: the response of the area-weighted mean to the
# forcing at each sea point at three lags (white: land), and to the whole pattern with
# ±2 total standard errors (the pattern's forcing is a column of its own in the estimate, so
# its error bars count the correlations between the points).
if __name__ == "__main__":
    lags = [0.0, 0.5, 2.0]
    fig, axes = plt.subplots(1, len(lags) + 2, figsize=(15, 3.4), layout="constrained")
    shown = pattern.where(~land)
    axes[0].pcolormesh(lon, lat, shown, shading="nearest", cmap="Greens")
    axes[0].set_title("forcing pattern")
    response = ds["response"].isel(i=0)
    top = float(abs(response).max())
    for ax, t in zip(axes[1:], lags, strict=False):
        frame = response.sel(lag=round(t / dt))
        mesh = ax.pcolormesh(lon, lat, frame, shading="nearest", cmap="RdBu_r", vmin=-top, vmax=top)
        ax.set_title(f"response map, t = {t:g}")
    fig.colorbar(mesh, ax=axes[1 : len(lags) + 1], shrink=0.8)
    for ax in axes[: len(lags) + 1]:
        ax.set_xlabel("lon")
    axes[0].set_ylabel("lat")
    whole, band = ds["pattern_response"].isel(i=0), ds["pattern_response_total_stderr"].isel(i=0)
    ax = axes[-1]
    ax.fill_between(ds.time, whole - 2 * band, whole + 2 * band, alpha=0.3, lw=0)
    ax.plot(ds.time, whole)
    ax.set_xlabel("time")
    ax.set_title("to the whole pattern")
    plt.show()
