"""Evaluators by name (or ``module:Class``), built from an :class:`EvaluatorSpec`."""

from __future__ import annotations

from polar.evaluators.base import Evaluator
from polar.evaluators.session_completed import SessionCompleted
from polar.evaluators.swe_tests import SWETests
from polar.evaluators.test_on_output import TestOnOutput
from polar.registry import Registry
from polar.schemas.task import EvaluatorSpec

EVALUATORS: Registry[Evaluator] = Registry("evaluator")
EVALUATORS.add("session_completed", SessionCompleted)
EVALUATORS.add("test_on_output", TestOnOutput)
EVALUATORS.add("swe_tests", SWETests)


def create_evaluator(spec: EvaluatorSpec) -> Evaluator:
    """The evaluator ``spec.strategy`` names; a ``module:Class`` one gets the spec too."""
    return EVALUATORS.create(spec.strategy, spec)
