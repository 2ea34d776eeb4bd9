"""Trajectory stores: the store contract, the writer and atomic writes."""
