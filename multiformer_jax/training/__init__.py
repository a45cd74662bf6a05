"""Training: a run and its loop (`train.py`, what `run.py` calls), what a stage trains with
(`stage.py`), the compiled update and dev loss (`steps.py`) on the losses (`loss.py`), the
optimizer (`optimizer.py`), the prepared data (`data_setup.py`), parameters carried between runs
and stages (`transfer.py`), the MT stage, data parallelism, learning curves."""
