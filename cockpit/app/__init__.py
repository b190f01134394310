"""The Textual cockpit: screens over a run record, live or replayed. Only this package imports Textual."""
