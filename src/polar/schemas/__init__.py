"""The public wire contract (pydantic models); names here are stable."""

from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus

__all__ = ["Trace", "Trajectory", "TrajectoryStatus"]
