"""Tandem configurations: the speculative engine with one drafter (`none` is the target-only
baseline that every speedup is measured against).

Unlike `Pipeline`, which loads its own runners, these share one target runner and one draft
runner across every Tandem configuration of the run, and build the drafter and the depth policy
per configuration, exactly as `Pipeline` does. Each run starts from empty caches (the drafter is
reset; the engine resets the target), so no prompt benefits from the previous one.
"""

from typing import Sequence

from tandem.bench.config_base import ConfigSpec
from tandem.bench.models import BenchModels
from tandem.engine.generator import SpeculativeGenerator
from tandem.engine.request import GenerationRequest
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.pipeline import parse_k
from tandem.spec.depth import build_depth
from tandem.spec.drafters.registry import build_drafter
from tandem.spec.sampling import SamplingParams

GREEDY = SamplingParams()


class TandemConfig:
    drafter_name = "none"
    uses_draft_model = False
    OPTIONS: tuple[str, ...] = ("k",)
    is_peer = False
    setup_rank = 0

    def __init__(self, spec: ConfigSpec, models: BenchModels):
        self.label = spec.label
        try:
            self.k = parse_k(spec.option("k", str(models.choice.k)))
        except TandemError as error:
            raise TandemError(f"config {spec.label!r}: {error}") from None
        self.models = models
        self.target = None
        self.drafter = None
        self.depth = None

    def setup(self) -> None:
        self.target = self.models.target_runner()
        draft_runner = self.models.draft_runner() if self.uses_draft_model else None
        self.drafter = build_drafter(self.drafter_name, draft_runner)
        self.depth = build_depth(self.drafter_name, self.k, self.target.cost)  # learns across prompts

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], dict]:
        request = GenerationRequest(tuple(prompt_ids), max_tokens, GREEDY, self.models.stop_token_ids)
        if hasattr(self.drafter, "reset"):
            self.drafter.reset()  # the draft runner is shared: its cache may hold another config's tokens
        token_ids, stats = SpeculativeGenerator(self.target, self.drafter, self.depth).generate(request)
        return token_ids, stats_record(stats)


def stats_record(stats: GenerationStats) -> dict:
    """The engine's counters that add up over prompts."""
    return {
        "prefill_s": stats.prefill_seconds,
        "draft_s": stats.draft_seconds,
        "verify_s": stats.verify_seconds,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "rounds_with_draft": stats.rounds_with_draft,
        "drafted_by_position": list(stats.drafted_by_position),
        "accepted_by_position": list(stats.accepted_by_position),
        "target_forwards": stats.target_forwards,
        "draft_forwards": stats.draft_forwards,
        "draft_sources": dict(stats.sources),
    }


class NoneConfig(TandemConfig):
    drafter_name = "none"
    OPTIONS = ()


class NgramConfig(TandemConfig):
    drafter_name = "ngram"


class ModelConfig(TandemConfig):
    drafter_name = "model"
    uses_draft_model = True


class HybridConfig(TandemConfig):
    drafter_name = "hybrid"
    uses_draft_model = True
