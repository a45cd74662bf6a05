"""Experiment configs: `default.py` documents every key; one file per experiment."""
