"""Shared test set-up: one BLAS thread (tests share two cores; multithreaded BLAS on a busy
machine is several times slower for the small matrix products the kernels do)."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
