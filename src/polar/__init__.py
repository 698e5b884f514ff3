"""Polar: token-faithful rollouts over any LLM agent harness."""

__version__ = "0.1.0"
