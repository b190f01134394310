"""Widgets of the cockpit app."""
