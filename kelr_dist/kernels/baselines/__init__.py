"""Baseline score estimators: the Gaussian kernel density estimate and the quasi-Gaussian FDT."""
