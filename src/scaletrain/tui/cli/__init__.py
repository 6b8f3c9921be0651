"""The `scaletrain` command line: argument parsing and dispatch (an explicit command table); the engine computes."""
