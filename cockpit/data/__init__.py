"""The user's own data: read through `datasets` (JSON Lines, JSON, Parquet, CSV, a `save_to_disk` folder),
mapped onto the fields the cockpit needs, checked with one-line errors, split, and inspected.

Nothing here imports `datasets` until a file is read.
"""

from cockpit.data.examples import FIELDS, DataSet, Problem, load_examples
from cockpit.data.source import DataError, read_table

__all__ = ["FIELDS", "DataError", "DataSet", "Problem", "load_examples", "read_table"]
