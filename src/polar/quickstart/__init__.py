"""``polar quickstart``: the whole of Polar on a laptop, in one command (see docs/quickstart.md)."""
