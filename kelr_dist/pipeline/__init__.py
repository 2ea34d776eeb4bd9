"""The estimate's steps, one read of the data each, and their composition."""
