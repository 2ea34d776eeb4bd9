"""The response pass: conjugate variables, lagged sums, block-averaged errors, Stein correction."""
