"""Pure numpy/numba kernels: each works on one in-memory block and never imports dask."""
