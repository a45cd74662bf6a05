"""Training: the two-stage loop (`train.py`), data parallelism, learning curves."""
