"""What changes during a run: sequences in flight and the verifier replicas that hold them."""

from collections import deque
from dataclasses import dataclass, field

from tandem.cluster.sim.config import SimDrafter, Verifier
from tandem.cluster.sim.timeline import Timeline
from tandem.speculation.batch_depth import BatchDepthPlanner


@dataclass(slots=True)
class SimSequence:
    request_id: int
    arrival_ms: float
    prompt_tokens: int
    max_tokens: int
    emitted: int = 0
    drafter_seen: int = 0  # leading committed tokens the draft model holds
    first_token_ms: float | None = None
    last_token_ms: float | None = None
    ready_ms: float = 0.0  # when it reaches its replica (placed, plus the router's half round trip)
    unprefilled: int = 0  # prompt tokens its replica has not scored yet
    moving_to: "Replica | None" = None  # the router moves it there at its replica's next step boundary
    moved: bool = False  # arrives with its KV state (a move): decodes on admission
    prefix: tuple[int, int] | None = None  # (group, tokens): the opening it shares with other prompts
    conversation: int | None = None  # the conversation it is a turn of (Workload.conversations)
    turn: int = 1  # 1-based
    requested: int = 0  # the max_tokens its request carries (0: max_tokens, where it ends)

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.emitted

    @property
    def remaining(self) -> int:
        """Tokens until it ends (max_tokens is where its answer ends: the cap, or a stop)."""
        return self.max_tokens - self.emitted

    @property
    def room(self) -> int:
        """Tokens its request may still take, as far as the router knows (`Routed.room`): it
        sees the request's max_tokens, not where the answer will stop."""
        return max(self.requested, self.max_tokens) - self.emitted

    def unseen_by_drafter(self) -> int:
        """Tokens the draft model must be fed before drafting (the last one is always fed)."""
        return self.context - min(self.drafter_seen, self.context - 1)


@dataclass(slots=True)
class Replica:
    """A verifier replica: its device's time, its drafter and depth planner, its sequences."""

    index: int
    spec: Verifier
    device: Timeline
    planner: BatchDepthPlanner
    drafter: SimDrafter | None = None
    drafter_device: Timeline | None = None
    waiting: deque[SimSequence] = field(default_factory=deque)
    running: list[SimSequence] = field(default_factory=list)
    incoming: list[SimSequence] = field(default_factory=list)  # moving here: each holds a slot already
    prefixes_held: set[int] = field(default_factory=set)  # shared openings its prompt cache holds, by group
    histories: dict[int, int] = field(default_factory=dict)  # conversation -> tokens of it its prompt cache holds

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.incoming)

    @property
    def sequences(self) -> list[SimSequence]:
        """Those it holds or will: running, waiting, and moving here."""
        return [*self.running, *self.waiting, *self.incoming]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
