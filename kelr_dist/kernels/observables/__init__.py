"""Observables and forcings: the built-in ones and the distribution observables."""
