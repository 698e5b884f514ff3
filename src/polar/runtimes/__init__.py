"""Where a harness runs: local, bubblewrap, docker, apptainer (see docs/runtimes.md)."""
