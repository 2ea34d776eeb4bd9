"""The passes that survey a trajectory: moments, tail statistics, non-finite values, subsamples."""
