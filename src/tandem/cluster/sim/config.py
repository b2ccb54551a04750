"""What the simulator is given: devices, drafters, verifier replicas, the network, the workload.

Plain frozen dataclasses, validated on construction, so a simulation can be built by hand, from a
cluster file (adapter.py) or from public device classes (device_classes.py) alike. Terms:

- a *device* is one accelerator or CPU running one model, with a measured (or public-spec) cost
  curve: ms to score n tokens in one forward pass. A fused device runs a batch as one pass over
  all its tokens, plus `per_sequence_ms` for every sequence after the first (reading its KV
  cache; where `deep_per_sequence_ms` is given, the term read at the cost curve's deep context,
  it is interpolated in the context as the curve is); a serial one runs the sequences of a
  batch one after another. Two Device values with
  one name are one physical device running two models (a worker that verifies and drafts):
  their calls share its time. Its optional `prompt_cost` prices scoring a prompt (logits at its
  last token only: a prefill, a draft model's catch-up); without one the cost curve stands in.
  Its `logits_row_ms` is what one token's logits row costs beyond the token (the cost curve asks
  a row at every token, as a verification does; a prompt part scored beside rounds asks none).
  Its optional `prefill_floor` is the floor chunk the engine would read off its own curve
  (engine/step_budget.py `floor_chunk`); without one it is read off `cost`.
- a *verifier replica* holds the target model on a device and verifies up to `max_batch`
  sequences per step; it names its drafter.
- a *drafter* proposes draft tokens: a draft model on a device, or the n-gram drafter (free,
  in the replica). Its acceptance model says how many drafts the target accepts.
- the *network* gives a round-trip time between two named groups of devices.
- a *host* (optional) is one machine whose cores several devices share: CPU workers of a local
  cluster. A call that starts while other calls run there takes longer in proportion to the
  threads asking for the host's cores (see timeline.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.cluster.sim.acceptance import AcceptanceModel
from tandem.cluster.sim.lengths import LengthModel
from tandem.models.cost import CostModel
from tandem.engine.step_budget import STEP_TOKEN_BUDGET
from tandem.speculation.batch_depth import STEP_OVERHEAD_MS
from tandem.speculation.depth import AUTO_K_MAX



@dataclass(frozen=True, slots=True)
class Device:
    name: str
    cost: CostModel  # ms to score n tokens in one forward pass (on a context, where it has a deep curve)
    fused: bool = True  # False: a batch costs the sum of its sequences' passes
    group: str = "local"  # network group
    per_sequence_ms: float = 0.0  # fused: extra time per sequence beyond the first
    host: str | None = None  # a machine whose cores this device shares with others (Simulation.host_cores)
    threads: int = 1  # cores its calls keep busy on that host
    prompt_cost: CostModel | None = None  # ms for one sequence's n prompt tokens, logits at the last only
    prefill_floor: int | None = None  # the engine's floor chunk on this device (None: read off `cost`)
    deep_per_sequence_ms: float | None = None  # per_sequence_ms at cost.deep_context (None: the same at every context)
    logits_row_ms: float = 0.0  # what a token's logits row adds to its cost (prompt tokens beside rounds ask none)

    def __post_init__(self):
        if self.threads < 1:
            raise ValueError(f"device {self.name}: threads must be >= 1, got {self.threads}")
        if self.per_sequence_ms < 0:
            raise ValueError(f"device {self.name}: per_sequence_ms must be >= 0, got {self.per_sequence_ms}")
        if self.logits_row_ms < 0:
            raise ValueError(f"device {self.name}: logits_row_ms must be >= 0, got {self.logits_row_ms}")
        if self.deep_per_sequence_ms is not None and self.deep_per_sequence_ms < 0:
            raise ValueError(f"device {self.name}: deep_per_sequence_ms must be >= 0, got {self.deep_per_sequence_ms}")
        if not self.name:
            raise ValueError("a device needs a name")
        if not self.group:
            raise ValueError(f"device {self.name}: network group must not be empty")
        if self.cost.cost_ms(1) <= 0:
            raise ValueError(f"device {self.name}: its cost curve must give a positive time for 1 token")
        if self.prefill_floor is not None and self.prefill_floor < 1:
            raise ValueError(f"device {self.name}: prefill_floor must be >= 1, got {self.prefill_floor}")

    def forward_ms(self, token_counts: Sequence[int], context: float | None = None) -> float:
        """One forward over a batch with these per-sequence token counts, on `context` cached
        tokens a sequence (None: the cost curve's base)."""
        counts = [n for n in token_counts if n > 0]
        if not counts:
            return 0.0
        if self.fused:
            return self._cost_at(sum(counts), context) + self.per_sequence_at(context) * (len(counts) - 1)
        return sum(self._cost_at(n, context) for n in counts)

    def per_sequence_at(self, context: float | None) -> float:
        """The per-sequence term on `context` cached tokens a sequence, weighted between its base
        and deep reads as the cost curve is (`CostModel.depth_weight`)."""
        fraction = 0.0 if self.deep_per_sequence_ms is None else self.cost.depth_weight(context)
        if fraction == 0.0:
            return self.per_sequence_ms
        return max(0.0, self.per_sequence_ms + fraction * (self.deep_per_sequence_ms - self.per_sequence_ms))

    def _cost_at(self, tokens: int, context: float | None) -> float:
        """The curve read at `context` without its cache of the last context's reads, which the
        planner's reads at the base keep (a simulated device learns no corrections)."""
        return self.cost.cost_ms(tokens) if context is None else self.cost.profiled_ms(tokens, context)

    def prompt_ms(self, token_counts: Sequence[int]) -> float:
        """One forward over these sequences' tokens with logits at each one's last token only:
        each sequence's one-token step, plus its other tokens at the prompt curve's price."""
        counts = [n for n in token_counts if n > 0]
        if self.prompt_cost is None or not counts:
            return self.forward_ms(counts)
        if self.fused:
            extra = self.prompt_cost.cost_ms(sum(counts)) - self.prompt_cost.cost_ms(len(counts))
            return self.forward_ms([1] * len(counts)) + max(0.0, extra)
        return sum(self.cost.cost_ms(1) + max(0.0, self.prompt_cost.cost_ms(n) - self.prompt_cost.cost_ms(1))
                   for n in counts)

    def lockstep_draft_ms(self, levels: Sequence[int]) -> float:
        """Drafting in lock-step: level j drafts one token for each of levels[j] sequences."""
        if self.fused:
            return sum(self.cost.cost_ms(n) + self.per_sequence_ms * (n - 1) for n in levels if n)
        return sum(levels) * self.cost.cost_ms(1)


@dataclass(frozen=True, slots=True)
class SimDrafter:
    name: str
    acceptance: AcceptanceModel
    device: Device | None = None  # None: the n-gram drafter, free, in the replica

    def __post_init__(self):
        if not self.name:
            raise ValueError("a drafter needs a name")

    @property
    def uses_model(self) -> bool:
        return self.device is not None

    @property
    def source(self) -> str:
        """The acceptance source the depth planner tracks (speculation/batch_depth.py)."""
        return "model" if self.uses_model else "ngram"


@dataclass(frozen=True, slots=True)
class Verifier:
    device: Device
    drafter: str | None = None  # a SimDrafter's name; None: plain decoding
    max_batch: int = 32

    def __post_init__(self):
        if self.max_batch < 1:
            raise ValueError(f"verifier {self.device.name}: max_batch must be >= 1, got {self.max_batch}")


@dataclass(frozen=True, slots=True)
class Network:
    """Round trips in ms: `links` lists (group, group, rtt), symmetric; a pair not listed costs
    `same_group_ms` inside one group and `default_ms` between two."""

    links: tuple[tuple[str, str, float], ...] = ()
    default_ms: float = 0.0
    same_group_ms: float = 0.0

    def __post_init__(self):
        for a, b, ms in self.links:
            if ms < 0:
                raise ValueError(f"network: rtt between {a} and {b} must be >= 0, got {ms}")
        if self.default_ms < 0 or self.same_group_ms < 0:
            raise ValueError("network: round trips must be >= 0")

    def rtt_ms(self, a: str, b: str) -> float:
        for x, y, ms in self.links:
            if (x, y) in ((a, b), (b, a)):
                return ms
        return self.same_group_ms if a == b else self.default_ms


@dataclass(frozen=True, slots=True)
class Workload:
    """`num_requests` requests: Poisson arrivals at `rate_per_s`, or `concurrency` closed-loop
    clients that send their next request when the last one finishes (exactly one of the two).
    `prompt_prefixes`: the opening each request's prompt shares with others (a system prompt),
    as (group, tokens) or None, request i taking entry i modulo their number (empty: none
    shared; an opening as long as a prompt counts as all but its last token, which is always scored);
    a replica's prompt cache scores a group's opening once, then reuses it (step.py).
    `conversations`: each conversation's new prompt tokens per turn (the first turn's whole
    prompt, then each follow-up's message): the requests are then their turns, conversation by
    conversation (num_requests is their number; prompt_tokens is not drawn), and a turn's prompt
    is the turn before's prompt and answer and its own new tokens. A closed-loop client sends a
    conversation's next turn when the answer before it ends, and opens the next conversation
    when its own ends; a replica that served a turn holds its history (step.py), and the router
    prefers it for the next (routing.py). `requested_tokens`: the max_tokens each request carries,
    where answers stop before it (a recorded run's lengths): the router sees only that cap
    (routing.py, moves.py); None, every answer runs to its cap."""

    num_requests: int
    prompt_tokens: LengthModel
    output_tokens: LengthModel
    rate_per_s: float | None = None
    concurrency: int | None = None
    prompt_prefixes: tuple[tuple[int, int] | None, ...] = ()
    conversations: tuple[tuple[int, ...], ...] = ()
    requested_tokens: int | None = None  # the max_tokens every request carries (None: its own output length)

    def __post_init__(self):
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if (self.rate_per_s is None) == (self.concurrency is None):
            raise ValueError("a workload needs exactly one of rate_per_s and concurrency")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.requested_tokens is not None and self.requested_tokens < 1:
            raise ValueError(f"requested_tokens must be >= 1, got {self.requested_tokens}")
        if any(prefix is not None and prefix[1] < 0 for prefix in self.prompt_prefixes):
            raise ValueError("a shared prompt prefix must be >= 0 tokens")
        if self.conversations:
            if self.concurrency is None:
                raise ValueError("conversations need closed-loop clients (concurrency), not arrivals at a rate")
            if any(not turns or min(turns) < 1 for turns in self.conversations):
                raise ValueError("every conversation needs at least one turn, each of at least one new token")
            turns = sum(len(c) for c in self.conversations)
            if self.num_requests != turns:
                raise ValueError(f"num_requests must be the conversations' {turns} turns, got {self.num_requests}")

    def prompt_prefix(self, request: int) -> tuple[int, int] | None:
        """(group, tokens) of the opening request `request` shares, or None."""
        return self.prompt_prefixes[request % len(self.prompt_prefixes)] if self.prompt_prefixes else None


@dataclass(frozen=True, slots=True)
class SimDepth:
    """A fixed k for every round, or (fixed_k None) the engine's E/T planner up to k_max."""

    fixed_k: int | None = None
    k_max: int = AUTO_K_MAX

    def __post_init__(self):
        if self.fixed_k is not None and self.fixed_k < 0:
            raise ValueError(f"fixed k must be >= 0, got {self.fixed_k}")
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")


@dataclass(frozen=True, slots=True)
class Simulation:
    """Everything one run needs. Each replica steps on its own (the engine's step, step.py);
    the router sits in `router_group` (None: the first verifier's), a half round trip from each
    replica each way."""

    verifiers: tuple[Verifier, ...]
    workload: Workload
    drafters: tuple[SimDrafter, ...] = ()
    network: Network = Network()
    depth: SimDepth = SimDepth()
    router_group: str | None = None  # None: the first verifier's group
    step_overhead_ms: float = STEP_OVERHEAD_MS
    step_token_budget: int = STEP_TOKEN_BUDGET  # tokens one replica step's call scores
    max_running: int | None = None  # the router's cap on requests in flight (`tandem serve --max-running`)
    host_cores: tuple[tuple[str, int], ...] = ()  # (host, cores): devices on it share its cores
    seed: int = 0

    def __post_init__(self):
        for host, cores in self.host_cores:
            if cores < 1:
                raise ValueError(f"host {host}: cores must be >= 1, got {cores}")
        if not self.verifiers:
            raise ValueError("a simulation needs at least one verifier")
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {names}")
        for v in self.verifiers:
            if v.drafter is not None and v.drafter not in names:
                raise ValueError(f"verifier {v.device.name} names drafter {v.drafter!r}, which is not defined")
        self._check_devices()
        if self.step_overhead_ms < 0:
            raise ValueError(f"step_overhead_ms must be >= 0, got {self.step_overhead_ms}")
        if self.step_token_budget < 1:
            raise ValueError(f"step_token_budget must be >= 1, got {self.step_token_budget}")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")

    def _check_devices(self) -> None:
        """One name, one place: the models of one physical device sit in one network group."""
        groups: dict[str, str] = {}
        devices = [v.device for v in self.verifiers] + [d.device for d in self.drafters if d.device]
        for device in devices:
            if groups.setdefault(device.name, device.group) != device.group:
                raise ValueError(f"device {device.name!r} is given two network groups")
        verifier_names = [v.device.name for v in self.verifiers]
        if len(set(verifier_names)) != len(verifier_names):
            raise ValueError(f"each verifier replica needs its own device, got {verifier_names}")

    def drafter(self, name: str | None) -> SimDrafter | None:
        return next((d for d in self.drafters if d.name == name), None)
