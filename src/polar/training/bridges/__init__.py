"""Bridges from Polar rollouts to external GRPO trainers: TRL, slime, verl."""
