"""The memory and time model: will a run fit, where, and how fast, before a single weight is loaded.

Pure arithmetic from the model's config.json (no torch, no Textual): `build_plan(profile)`.
"""

from cockpit.plan.configuration import Setup
from cockpit.plan.estimator import Estimate, estimate
from cockpit.plan.geometry import ModelGeometry, geometry_from_config, load_geometry
from cockpit.plan.hardware import Hardware, resolve_hardware
from cockpit.plan.inputs import Assumptions, Inputs, PlanError
from cockpit.plan.planner import Plan, build_plan
from cockpit.plan.weights import Precision

__all__ = [
    "Assumptions",
    "Estimate",
    "Hardware",
    "Inputs",
    "ModelGeometry",
    "Plan",
    "PlanError",
    "Precision",
    "Setup",
    "build_plan",
    "estimate",
    "geometry_from_config",
    "load_geometry",
    "resolve_hardware",
]
