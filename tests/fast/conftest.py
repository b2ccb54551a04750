import pytest

from engine_support import MAX_TOKENS, PROMPTS, naive_greedy
from tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-target"), seed=1)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-draft"), seed=2, layers=1)


@pytest.fixture(scope="session")
def references(tiny_target):
    """Each prompt's target-only greedy output, decoded the slow way."""
    return {p: naive_greedy(tiny_target, p, MAX_TOKENS) for p in PROMPTS}
