"""Score a finished session: session_completed, test_on_output, swe_tests (see docs/runtimes.md)."""
