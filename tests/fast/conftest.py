import shutil

import pytest

from engine_support import MAX_TOKENS, PROMPTS, naive_greedy
from tandem.paths import models_dir, profiles_dir
from tiny_models import build_tiny_model


@pytest.fixture(scope="session", autouse=True)
def own_home(tmp_path_factory):
    """A $TANDEM_HOME of the run's own: the tiny models built here are profiled, and caches
    written, there and not into the user's home (each run's models have new paths, so every run
    left its profiles behind). Pulled models are read from the user's home (a link), and its
    profiles copied, so a pulled model is not measured again. The link is the user's folder: a
    test that removes, pulls or converts a catalog model sets a home of its own (as the rm tests do)."""
    home = tmp_path_factory.mktemp("tandem-home")
    if models_dir().is_dir():
        (home / "models").symlink_to(models_dir(), target_is_directory=True)
    if profiles_dir().is_dir():
        shutil.copytree(profiles_dir(), home / "profiles")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_HOME", str(home))
        yield home


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
