import os

import pytest

# Every test process uses its own organism cache; the shipped default organism is read from the package.
os.environ.setdefault("OPCT_HOME", os.path.join(os.environ.get("PYTEST_OPCT_HOME", "/tmp"), f"opct-test-{os.getpid()}"))


@pytest.fixture(scope="session")
def test_organism(tmp_path_factory):
    """The `test` size organism, built once per session (under a minute on 2 cores)."""
    from opct.organism.build import build_organism

    os.environ["OPCT_HOME"] = str(tmp_path_factory.mktemp("opct_home"))
    return build_organism("test", progress=False)


@pytest.fixture(scope="session")
def test_attacker(test_organism):
    """The `test` size attacker LM, pretrained once per session (about 10 s) in the session's OPCT_HOME."""
    from opct.axes.jailbreak import WRAPPER_FAMILIES
    from opct.evals.attacker.lm import build_attacker

    return build_attacker(WRAPPER_FAMILIES, "test")
