"""evaluators package."""
