"""Assemble a batching engine from a pipeline config: batch runners for the target and draft
(the draft only when the drafter uses a model), the same tokenizer check as the CLI."""

from tandem.engine.batch_engine import BatchEngine
from tandem.errors import TandemError
from tandem.models.batch_backends import load_batch_runner
from tandem.models.resolve import tokenizer_path
from tandem.pipeline import PipelineConfig
from tandem.text.tokenizer import TextTokenizer, check_same_vocabulary

DEFAULT_MAX_RUNNING = 8


def build_engine(config: PipelineConfig, max_running: int = DEFAULT_MAX_RUNNING, ngram_store=None) -> BatchEngine:
    if not 1 <= max_running <= 64:
        raise TandemError(f"max running sequences must be between 1 and 64, got {max_running}")
    draft = None
    if config.draft is not None and config.drafter in ("model", "hybrid"):
        target_tokenizer = TextTokenizer(str(tokenizer_path(config.target.model)))
        check_same_vocabulary(target_tokenizer, TextTokenizer(str(tokenizer_path(config.draft.model))))
        draft = load_batch_runner(config.draft, max_running)
    target = load_batch_runner(config.target, max_running)
    return BatchEngine(target, draft, config.drafter, config.k, ngram_store, max_running)
