"""How far the ratings can be trusted: reproducibility, sample stability, forward returns."""
