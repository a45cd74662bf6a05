"""Experiment configs, one file per experiment; every key, its default and its meaning are
declared in multiformer_jax.schema (`python run.py --config=FILE --print_config` shows them
all with the experiment's values)."""
