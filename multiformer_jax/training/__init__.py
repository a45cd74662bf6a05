"""Training: a run (`train.py`), its prepared data (`data_setup.py`), one stage's loop
(`loop.py`), the compiled steps (`steps.py`), the optimizer (`optimizer.py`), parameters carried
between runs and stages (`transfer.py`), the text stage, data parallelism, learning curves."""
