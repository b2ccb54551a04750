"""Where Tandem keeps models and caches: `$TANDEM_HOME`, default `~/.cache/tandem`."""

import os
from pathlib import Path


def tandem_home() -> Path:
    return Path(os.environ.get("TANDEM_HOME") or Path.home() / ".cache" / "tandem")


def models_dir() -> Path:
    return tandem_home() / "models"


def profiles_dir() -> Path:
    return tandem_home() / "profiles"
