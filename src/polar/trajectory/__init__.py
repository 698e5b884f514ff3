"""trajectory package."""
