"""Drafter registry: `--drafter model|ngram|hybrid|none` maps to a constructor here."""

from typing import Callable

from tandem.errors import TandemError
from tandem.models.runner import ModelRunner
from tandem.spec.drafters.base import Drafter
from tandem.spec.drafters.hybrid import HybridDrafter
from tandem.spec.drafters.model import ModelDrafter
from tandem.spec.drafters.ngram import NgramDrafter
from tandem.spec.drafters.none import NoDrafter


def _needs_model(build: Callable[[ModelRunner], Drafter]) -> Callable[[ModelRunner | None], Drafter]:
    def checked(draft_runner: ModelRunner | None) -> Drafter:
        if draft_runner is None:
            raise TandemError("this drafter needs a draft model: pass --draft NAME")
        return build(draft_runner)

    return checked


DRAFTERS: dict[str, Callable[[ModelRunner | None], Drafter]] = {
    "none": lambda draft_runner: NoDrafter(),
    "ngram": lambda draft_runner: NgramDrafter(),
    "model": _needs_model(ModelDrafter),
    "hybrid": _needs_model(lambda runner: HybridDrafter(ModelDrafter(runner))),
}


def build_drafter(name: str, draft_runner: ModelRunner | None) -> Drafter:
    if name not in DRAFTERS:
        raise TandemError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    return DRAFTERS[name](draft_runner)
