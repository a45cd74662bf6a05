"""What every command shares at run time: a run's checkpoints and saved config, its logs,
fault injection for the reliability tests, and the huge-pages re-execution."""
