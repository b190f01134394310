"""Dress rehearsal: the real architecture, sliced to a few depths with random weights, measured, and the
whole run predicted from what was measured (`measure` reads a rehearsal's record, `predict` fits and
scales, `render` prints)."""
