"""`benchmarks/nf4_ncu.py --loop`: the K loop's instruction counts read from Triton's SASS disassembly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.nf4_ncu import k_loop, loop_table

SASS = """Function:_kernel
--:-:1:-:1\tLDC R1, c[0x0][0x28];
LBB1:
--:-:-:-:1\tIADD3 R2, R2, 0x1, RZ;
LBB0:
--:-:-:-:1\tLDS.U8 R4, [R5];
--:-:-:-:1\t@!P0 PRMT R6, R4, 0x7654, R6;
--:-:-:-:1\tPRMT R7, R4, 0x3210, R6;
--:-:-:-:1\tHGMMA.64x16x16.F32.BF16 R8, gdesc[UR4], R8;
--:-:-:-:1\tLDGDEPBAR;
--:-:-:-:6\t@!P6 BRA LBB0;
--:-:-:-:1\tLDS R9, [R5];
--:-:-:-:5\t@!P1 BRA LBB1;
--:-:-:-:1\tEXIT;
LBB2:
--:-:-:-:1\tBRA LBB2;
"""


def test_the_innermost_loop_that_runs_the_tensor_cores_is_counted_by_opcode() -> None:
    """The K loop (LBB0), not the persistent loop around it (LBB1) nor the spin at the end (LBB2);
    predicates, suffixes and an operand-less instruction's semicolon dropped."""
    assert k_loop(SASS) == {"LDS": 1, "PRMT": 2, "HGMMA": 1, "LDGDEPBAR": 1, "BRA": 1}


def test_a_kernel_without_tensor_cores_is_refused() -> None:
    with pytest.raises(ValueError, match="tensor-core"):
        k_loop(SASS.replace("HGMMA", "FFMA"))


def test_the_table_has_a_column_a_file_and_the_json_its_counts(tmp_path: Path) -> None:
    a, b = tmp_path / "bytes.sass", tmp_path / "words.sass"
    a.write_text(SASS)
    b.write_text(SASS.replace("LDS.U8 R4, [R5];", "LDS.64 R4, [R5];\n--:-:-:-:1\tLDS.64 R10, [R5];"))
    loop_table([a, b], tmp_path / "out.md")
    counts = json.loads((tmp_path / "out.json").read_text())
    assert counts["bytes"]["LDS"] == 1 and counts["words"]["LDS"] == 2
    table = (tmp_path / "out.md").read_text()
    assert "| all | 6 | 7 |" in table and "| LDS | 1 | 2 |" in table
