"""Offline SFT data generation: run a model over SWE-style instances, keep what passes."""
