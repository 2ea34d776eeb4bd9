"""The distributed engine: Dask clients and the map-reduce of a Reduction over a trajectory."""
