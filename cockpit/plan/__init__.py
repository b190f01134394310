"""The memory and time model: will a run fit, where, and how fast, before a single weight is loaded.

Pure arithmetic from the model's config.json (no torch, no Textual): `build_plan(profile)`.
"""

from cockpit.plan.geometry import ModelGeometry, geometry_from_config, load_geometry
from cockpit.plan.hardware import Hardware, resolve_hardware
from cockpit.plan.model import Assumptions, Estimate, Inputs, Precision, Setup, estimate
from cockpit.plan.planner import Plan, PlanError, build_plan

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
