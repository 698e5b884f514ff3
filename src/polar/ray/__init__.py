"""Polar on Ray: the rollout server and one gateway per node as Ray actors (``polar ray up``).

Ray only places, supervises and restarts them; sessions, results, model calls and callbacks
stay HTTP. Ray itself is imported when a function here is called, never at import time.
"""

from polar.ray.config import PolarRayConfig
from polar.ray.launcher import PolarRay, attach, down, up

__all__ = ["PolarRay", "PolarRayConfig", "attach", "down", "up"]
