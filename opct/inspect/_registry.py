"""The inspect_ai entry point (pyproject `[project.entry-points.inspect_ai] opct`): importing this registers the
tasks `opct/sycophancy`, `opct/jailbreak`, `opct/awareness` and `opct/capability`."""

from opct.inspect import awareness, capability, jailbreak, sycophancy  # noqa: F401
