"""What data_prep and multiformer_jax both use, importing nothing else of the project: how a
command reports a user's error (cli_errors), progress of long work (progress), the token ids of
every vocabulary (token_ids) and the package cache with its Debian fetcher (packages)."""
