"""Per-turn rewards: hooks that score each model call from what followed it."""
