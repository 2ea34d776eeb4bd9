"""Function families, affine coordinates and the basis spec grammar (paper §3.1)."""
