"""Trajectory builders (per_request, prefix_merging) and trainer-ready exports."""
