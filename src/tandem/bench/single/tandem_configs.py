"""Tandem configurations: the batching engine with one drafter, one request at a time, exactly
as `tandem generate` runs it (`none` is the target-only baseline that every speedup is measured
against).

They share one target and one draft batch runner across every Tandem configuration of the run;
each builds its own engine (drafters and planner, which learns across prompts as a server's
does). Each prompt starts from empty caches (the engine forgets retained prompt caches), so no
prompt benefits from the previous one.
"""

from typing import Sequence

from tandem.bench.single.config_base import ConfigSpec
from tandem.bench.single.models import BenchModels
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.request import GenerationRequest
from tandem.engine.run_request import generate
from tandem.engine.stats import GenerationStats
from tandem.errors import TandemError
from tandem.speculation.depth import parse_depth
from tandem.speculation.sampling import SamplingParams

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
            self.k = parse_depth(spec.option("k", str(models.choice.k)))
        except TandemError as error:
            raise TandemError(f"config {spec.label!r}: {error}") from None
        self.models = models
        self.engine: BatchEngine | None = None

    def setup(self) -> None:
        draft = self.models.draft_runner() if self.uses_draft_model else None
        self.engine = BatchEngine(self.models.target_runner(), draft, self.drafter_name, self.k, max_running=1,
                                  step_token_budget=self.models.choice.step_token_budget,
                                  prefill_floor=self.models.choice.prefill_floor,
                                  prefill_waves=self.models.choice.prefill_waves)

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], dict]:
        request = GenerationRequest(tuple(prompt_ids), max_tokens, GREEDY, self.models.stop_token_ids)
        self.engine.clear_caches()  # the runners are shared: their caches may hold another config's tokens
        token_ids, stats = generate(self.engine, request)
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


class SuffixConfig(TandemConfig):
    drafter_name = "suffix"


class ModelConfig(TandemConfig):
    drafter_name = "model"
    uses_draft_model = True


class HybridConfig(TandemConfig):
    drafter_name = "hybrid"
    uses_draft_model = True
