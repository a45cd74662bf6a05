"""Corpus preparation: readers, features, SentencePiece, ArrayRecord shards (this folder's
modules); the embedded corpus (`embedded/`); what data_prep and multiformer_jax share
(`common/`)."""
