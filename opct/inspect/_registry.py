"""The inspect_ai entry point (pyproject `[project.entry-points.inspect_ai] opct`): importing this registers the
tasks `opct/sycophancy`, `opct/jailbreak`, `opct/awareness`, `opct/capability`, `opct/persona`, `opct/conditional`,
`opct/frustration` and `opct/prefill`, and the model provider `opct` (`--model opct/local -M model_path=DIR`)."""

from opct.inspect import (  # noqa: F401
    awareness,
    capability,
    conditional,
    frustration,
    jailbreak,
    persona,
    prefill,
    sycophancy,
)
