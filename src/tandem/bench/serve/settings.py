"""What a serving benchmark run was asked for, validated: configs, concurrency levels, sizes.

Requests per concurrency level C default to max(MIN_REQUESTS, REQUESTS_PER_CLIENT * C): 20 is
four prompts of each of the default workload's five categories, and two requests per client keeps
the pool at full concurrency for most of the run at high C. `--num-prompts N` sets N for every
level instead (N must reach the largest C, or that concurrency would never be reached).
"""

from dataclasses import dataclass
from pathlib import Path

from tandem.bench.serve.server_kinds import SERVER_KINDS
from tandem.errors import TandemError
from tandem.models.torch_runner import DTYPES

DEFAULT_CONFIGS = "tandem-spec,tandem-nospec,llamacpp-server"
DEFAULT_CONCURRENCY = "1,2,4,8,16"
MIN_REQUESTS = 20
REQUESTS_PER_CLIENT = 2
MAX_CONCURRENCY = 1024


def parse_configs(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise TandemError(f"--configs names no config; known: {', '.join(SERVER_KINDS)}")
    for name in names:
        if name not in SERVER_KINDS:
            raise TandemError(f"unknown config {name!r}; known: {', '.join(SERVER_KINDS)}")
    if len(set(names)) != len(names):
        raise TandemError(f"--configs names a config twice: {text!r}")
    return names


def parse_concurrency(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, each at most MAX_CONCURRENCY; kept in ascending order."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise TandemError(f"--concurrency must be comma-separated positive integers, got {text!r}")
    levels = sorted(set(int(part) for part in parts))
    if levels[0] < 1 or levels[-1] > MAX_CONCURRENCY:
        raise TandemError(f"--concurrency levels must be between 1 and {MAX_CONCURRENCY}, got {text!r}")
    return tuple(levels)


@dataclass(frozen=True, slots=True)
class ServeBenchSettings:
    target: str
    draft: str
    configs: tuple[str, ...]
    concurrency: tuple[int, ...]
    prompts_file: Path
    out_dir: Path
    num_prompts: int | None = None  # requests per level; None = the default formula
    max_tokens: int = 50
    max_tokens_spread: int = 0  # request i's cap is max_tokens + an offset in [-spread, spread] (requests.py)
    threads: int | None = None  # per server (and per model in Tandem); None = all cores
    command: str = "tandem bench-serve"
    backend: str = "llamacpp"  # Tandem's target and draft backend: llamacpp | torch
    dtype: str = "fp32"  # torch dtype of Tandem's models
    draft_backend: str | None = None  # Tandem's draft backend (None: as the target)

    def __post_init__(self):
        if self.backend not in ("llamacpp", "torch"):
            raise TandemError(f"--backend must be llamacpp or torch, got {self.backend!r}")
        if self.dtype not in DTYPES:  # before the weights load, not after
            raise TandemError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_tokens < 1:
            raise TandemError(f"--max-tokens must be a positive integer, got {self.max_tokens}")
        if not 0 <= self.max_tokens_spread < self.max_tokens:
            raise TandemError(f"--max-tokens-spread must be at least 0 and below --max-tokens ({self.max_tokens}), "
                              f"got {self.max_tokens_spread}")
        if self.threads is not None and self.threads < 1:
            raise TandemError(f"--threads must be a positive integer, got {self.threads}")
        check_num_prompts(self.num_prompts, self.concurrency)

    def requests_at(self, concurrency: int) -> int:
        return requests_per_level(self.num_prompts, concurrency)


def check_num_prompts(num_prompts: int | None, concurrency: tuple[int, ...]) -> None:
    if num_prompts is not None and num_prompts < 1:
        raise TandemError(f"--num-prompts must be at least 1, got {num_prompts}")
    if num_prompts is not None and num_prompts < max(concurrency):
        raise TandemError(f"--num-prompts {num_prompts} is below the largest concurrency "
                          f"{max(concurrency)}, which would never be reached")


def requests_per_level(num_prompts: int | None, concurrency: int) -> int:
    """--num-prompts, else max(MIN_REQUESTS, REQUESTS_PER_CLIENT * C)."""
    if num_prompts is not None:
        return num_prompts
    return max(MIN_REQUESTS, REQUESTS_PER_CLIENT * concurrency)
