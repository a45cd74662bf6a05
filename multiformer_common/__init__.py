"""The project's shared core: what both data_prep (below the package) and multiformer_jax use,
importing nothing else of the project, neither JAX nor numpy at import. The user-error type
(errors) and how a command reports it (cli_errors), settings declared once with their meaning
and valid values (settings), atomic writes, directory locks, stop signals, progress of long
work, the token ids of every vocabulary (token_ids), the package cache with its Debian fetcher
(packages) and C++ sources compiled once per machine (native_build)."""
