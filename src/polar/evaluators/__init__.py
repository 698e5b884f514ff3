"""Score a finished session: session_completed, test_on_output (see docs/runtimes.md)."""
