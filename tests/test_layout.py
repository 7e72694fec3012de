"""The shape of the package: no module past 400 lines, and a threat axis named in one home (its module in
opct/axes/), so that adding a threat is adding one module."""

import re
from pathlib import Path

import pytest

from opct.axes import AXES

PKG = Path(__file__).resolve().parents[1] / "opct"


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these modules by noun: {long}"


@pytest.mark.parametrize("axis", ["sycophancy", "jailbreak", "awareness", "capability", "persona", "frustration",
                                  "conditional"])
def test_an_axis_name_is_written_in_at_most_two_files_outside_the_world(axis):
    assert axis in AXES
    literal = re.compile(rf"""["']{axis}["']""")
    files = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                   if "world" not in p.relative_to(PKG).parts and literal.search(p.read_text()))
    assert f"axes/{axis}.py" in files and len(files) <= 2, files
