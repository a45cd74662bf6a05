"""Prepared data -> batches: the input pipeline (bucketing, padding, SpecAugment, worker
processes). It imports neither JAX nor the model."""
