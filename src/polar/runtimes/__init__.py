"""runtimes package."""
