"""Screens of the cockpit app."""
