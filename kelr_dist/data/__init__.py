"""Trajectory stores and the models and simulator that fill them."""
