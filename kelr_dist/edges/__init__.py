"""User edges: the command line, job files, reports and the post-analysis accessor."""
