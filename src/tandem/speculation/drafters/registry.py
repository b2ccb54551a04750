"""The drafters, one table: `DRAFTERS` names each drafter Tandem can run and says, once, what
every part of Tandem needs to know of it: whether it needs a draft model (and what share of its
tokens the model proposes), the acceptance planning assumes before measuring, and a line for
`--help`. The CLI's `--drafter` choices, the API's `"drafter"`, `tandem serve --cluster`, the
cluster planner (cluster/planning/acceptance.py) and the simulator all read it, and a name not
in it is an error everywhere. `generate`, `serve` and the cluster build the drafters themselves
with `build_drafters`; they differ only in where the draft model runs (a `DraftModel`).

A drafter that needs a draft model where there is none is an error, never silently another
drafter: only the default (`--drafter` left out) is chosen by what exists (`default_drafter`).
"""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from tandem.errors import TandemError
from tandem.speculation.depth import PRIOR_ACCEPTANCE
from tandem.speculation.drafters.base import Drafter
from tandem.speculation.drafters.hybrid import HYBRID_NGRAM, HybridDrafter
from tandem.speculation.drafters.model import DraftModel, ModelDrafter
from tandem.speculation.drafters.ngram import NgramDrafter
from tandem.speculation.drafters.none import NoDrafter
from tandem.speculation.drafters.suffix import SuffixDrafter

HYBRID_MODEL_SHARE = 0.7  # planning: share of a hybrid drafter's tokens proposed by the draft model
DEFAULT_DRAFTER = "hybrid"  # where a draft model exists; else COPY_DRAFTER
COPY_DRAFTER = "ngram"


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    name: str
    summary: str  # one line for --help
    model_share: float  # share of draft tokens the draft model proposes (0: needs no model)
    prior_acceptance: float | None  # planning's acceptance per draft token until measured (None: drafts nothing)

    def __post_init__(self):
        if not 0.0 <= self.model_share <= 1.0:
            raise ValueError(f"drafter {self.name}: model_share must be in [0, 1]")

    @property
    def uses_model(self) -> bool:
        return self.model_share > 0

    @property
    def drafts(self) -> bool:
        return self.prior_acceptance is not None


# Planning's acceptance until measured: the draft model's is the engine's own prior
# (speculation/depth.py); a copy's 0.4 sits near the engine's prior for a 2-token match (0.42),
# since on fresh text most matches are short; hybrid's 0.65 assumes copies, where they exist,
# beat the model a little.
DRAFTERS: Mapping[str, DrafterSpec] = MappingProxyType({spec.name: spec for spec in (
    DrafterSpec("none", "no drafts: plain decoding", 0.0, None),
    DrafterSpec("ngram", "copies what followed the context's last n-gram earlier in it (or in the shared store)",
                0.0, 0.4),
    DrafterSpec("suffix", "copies what most often followed the context's suffix, in the request or recent outputs",
                0.0, 0.4),
    DrafterSpec("model", "the draft model proposes every token", 1.0, PRIOR_ACCEPTANCE),
    DrafterSpec("hybrid", "copies where the context repeats, the draft model elsewhere", HYBRID_MODEL_SHARE, 0.65),
)})
DRAFTER_NAMES = tuple(DRAFTERS)
USES_MODEL = MappingProxyType({name: spec.uses_model for name, spec in DRAFTERS.items()})


def drafter_spec(name: str) -> DrafterSpec:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise TandemError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}") from None


def drafter_help(default: str = f"{DEFAULT_DRAFTER} with a draft model, else {COPY_DRAFTER}") -> str:
    """`--drafter`'s help: every name with its line."""
    names = "; ".join(f"{spec.name}: {spec.summary}" for spec in DRAFTERS.values())
    return f"{' | '.join(DRAFTER_NAMES)} ({names}; default: {default})"


def default_drafter(has_draft_model: bool) -> str:
    """The drafter when none is asked for."""
    return DEFAULT_DRAFTER if has_draft_model else COPY_DRAFTER


def check_drafter(name: str, has_draft_model: bool = True,
                  how_to_add: str = "pass --draft NAME") -> str:
    """The name, if it is a drafter this engine can run; a clear error otherwise (never another
    drafter in its place)."""
    if drafter_spec(name).uses_model and not has_draft_model:
        copies = ", ".join(n for n, spec in DRAFTERS.items() if not spec.uses_model)
        raise TandemError(f"drafter {name!r} needs a draft model: {how_to_add}, or choose one that "
                          f"needs none ({copies})")
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
