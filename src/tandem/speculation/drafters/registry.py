"""The drafter registry: `--drafter none|ngram|suffix|model|hybrid` (and the API's `"drafter"`) name a
class here. `generate`, `serve` and the cluster all build their drafters with `build_drafters`;
they differ only in where the draft model runs (a `DraftModel`)."""

from types import MappingProxyType

from tandem.errors import TandemError
from tandem.speculation.drafters.base import Drafter
from tandem.speculation.drafters.hybrid import HYBRID_NGRAM, HybridDrafter
from tandem.speculation.drafters.model import DraftModel, ModelDrafter
from tandem.speculation.drafters.ngram import NgramDrafter
from tandem.speculation.drafters.none import NoDrafter
from tandem.speculation.drafters.suffix import SuffixDrafter

DRAFTER_NAMES = ("none", "ngram", "suffix", "model", "hybrid")
USES_MODEL = MappingProxyType({"none": False, "ngram": False, "suffix": False, "model": True, "hybrid": True})


def check_drafter(name: str, has_draft_model: bool = True) -> str:
    """The name, if it is a drafter this engine can run; a clear error otherwise."""
    if name not in USES_MODEL:
        raise TandemError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    if USES_MODEL[name] and not has_draft_model:
        raise TandemError(f"drafter {name!r} needs a draft model: pass --draft NAME")
    return name


def build_drafters(draft_model: DraftModel | None, ngram_store=None) -> dict[str, Drafter]:
    """Every drafter this engine can run, by name (those needing a model only with one)."""
    suffix = SuffixDrafter()  # one shared index of recent outputs, for `suffix` and `hybrid` alike
    drafters: dict[str, Drafter] = {"none": NoDrafter(), "ngram": NgramDrafter(store=ngram_store), "suffix": suffix}
    if draft_model is not None:
        model = ModelDrafter(draft_model)
        drafters["model"] = model
        drafters["hybrid"] = HybridDrafter(model, NgramDrafter(*HYBRID_NGRAM, store=ngram_store), suffix)
    return drafters
