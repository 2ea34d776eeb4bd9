"""Score estimators and their choice: kernel embedding, score matching, index sets, refits."""
