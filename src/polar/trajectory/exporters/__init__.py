"""Trainer-ready exports of trajectories: one module per target format."""
