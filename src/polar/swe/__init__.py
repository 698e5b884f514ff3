"""SWE-bench-format tasks: instances, their images, the TaskRequests made from them, and a
bundled set of tiny repositories with real bugs that runs on a laptop.

A "parts" package: it builds TaskRequests and names its evaluator (``swe_tests``) by string,
so it knows nothing of the servers that run them.
"""

from __future__ import annotations

from polar.swe.images import image_name
from polar.swe.instances import SWEInstance, load_instances
from polar.swe.tasks import SWETaskOptions, instance_task, swe_task_id

__all__ = [
    "SWEInstance",
    "SWETaskOptions",
    "image_name",
    "instance_task",
    "load_instances",
    "swe_task_id",
]
