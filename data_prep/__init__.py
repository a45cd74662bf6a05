"""Corpus preparation: readers, features, SentencePiece, ArrayRecord shards (this folder's
modules); the embedded corpus (`embedded/`). What data_prep and multiformer_jax share is the
project's core, multiformer_common."""
