"""Corpus preparation: readers, features, the embedded corpus, SentencePiece, TFDS shards."""
