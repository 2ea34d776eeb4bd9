"""Simulators and benchmark systems with closed-form densities (the method never imports them)."""
