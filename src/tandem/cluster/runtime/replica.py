"""A verifier replica: the one batching engine (engine/batch_engine.py) over this worker's target
runner, stepping on its own thread behind add / cancel / detach / poll. A plain class; the Ray
actor (cluster/runtime/actors.py) only wraps it, serving calls concurrently (a poll waits for
news while adds come in).

The replica runs what the single-process engine runs: chunked prefill within the step budget,
the KV budget and preemption, the prompt cache and its host tier, n-gram and suffix copies.
Model drafts come from the cluster's drafter workers through `RemoteDraftModel`, a `DraftModel`
like the local one (cluster/runtime/remote_draft.py); the router hands the replica links to
them (`set_drafters`) whenever they start, restart or die.

Each placement is named by the router (`seq_id`), so the updates of a placement it has moved or
re-submitted elsewhere are told apart from the new one's. Updates and step reports queue here
until the router's next `poll` takes them. A sequence detached to move elsewhere takes its KV
state with it where the runner can save one (`Detached`): the next replica puts it in its
prompt cache's host tier before admitting the sequence, which then restores it instead of
prefilling its history again.
"""

import logging
import os
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from tandem.cluster.runtime.emulation import Emulation, SlowedRunner, delayed
from tandem.cluster.runtime.endpoints import Endpoint
from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.remote_draft import RemoteDraftModel
from tandem.engine.batch_engine import BatchEngine
from tandem.engine.step_budget import STEP_TOKEN_BUDGET
from tandem.engine.events import SequenceUpdate, SpeculationOptions, StepReport
from tandem.engine.prefix_index import BLOCK
from tandem.engine.host_cache import HostEntry, HostPromptCache
from tandem.engine.request import GenerationRequest
from tandem.errors import TandemError, client_message
from tandem.models.batch_runner import BatchRunner
from tandem.models.cost import CostModel, CostView
from tandem.speculation.depth import Auto, Depth
from tandem.speculation.drafters.registry import build_drafters

log = logging.getLogger(__name__)

POLL_WAIT_S = 1.0  # a poll with no news returns empty after this long (the router polls again)


@dataclass(frozen=True, slots=True)
class DrafterLink:
    """A drafter worker as a replica reaches it."""

    name: str
    endpoint: Endpoint
    cost_ms: dict  # its cost curves, as its `info` reported them (CostModel.to_wire)
    incarnation: int = 0  # its restarts so far: a new process holds no sequence
    rtt_ms: float = 0.0  # round trip between this replica and the drafter (the cluster file's)


@dataclass(frozen=True, slots=True)
class Detached:
    """A sequence taken off a replica: the output it committed, and its target KV state where
    the runner could save it (None: the next replica prefills it again), with the key of the
    model that computed it (its host tier's): a replica of another model or precision refuses it
    (bf16 and fp16 rows are the same size, so nothing else would tell them apart)."""

    output: tuple[int, ...]
    state: HostEntry | None = None
    state_key: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaNews:
    """What a poll hands the router: updates and step reports since the last poll, and the
    replica's load and learned cost curve (for placement)."""

    updates: tuple[SequenceUpdate, ...]
    reports: tuple[StepReport, ...]
    running: int
    waiting: int
    cost_ms: dict  # its cost curves as learned so far (CostModel.to_wire)


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """What a verifier replica is built with beside its runner: from the cluster file (its
    worker's `cache_ram`) and `tandem serve`'s options (`--cache`, `--step-tokens`,
    `--prefill-floor`, `--prefill-waves`)."""

    cache_ram_bytes: int | None = None  # its prompt cache's host tier (None: the process default)
    ngram_store_url: str | None = None  # None or "memory": its own n-gram store; redis://...: shared
    ngram_namespace: str = "default"  # the store's namespace (one per vocabulary)
    step_token_budget: int = STEP_TOKEN_BUDGET
    prefill_floor: int | None = None  # None: read off the target's profile
    prefill_waves: bool = False  # `--prefill-waves`


class ReplicaEngine:
    def __init__(self, runner: BatchRunner, emulation: Emulation = Emulation(), drafter: str = "hybrid",
                 depth: "Depth | str | int" = Auto(), max_running: int | None = None,
                 step_token_budget: int = STEP_TOKEN_BUDGET, host_cache: HostPromptCache | None = None,
                 ngram_store=None, prefill_floor: int | None = None, prefill_waves: bool = False):
        self.runner = SlowedRunner.around(runner, emulation.slowdown)
        self.emulation = emulation
        self.remote = RemoteDraftModel([])
        self.engine = BatchEngine(self.runner, None, drafter, depth, ngram_store, max_running,
                                  drafters=build_drafters(self.remote, ngram_store),
                                  step_token_budget=step_token_budget, host_cache=host_cache,
                                  prefill_floor=prefill_floor, prefill_waves=prefill_waves)
        self._news = threading.Condition()
        self._updates: list[SequenceUpdate] = []
        self._reports: list[StepReport] = []
        self._commands: deque = deque()  # applied by the engine thread between steps
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- calls from the router ------------------------------------------------------------------

    def info(self) -> dict:
        return {"pid": os.getpid(), "name": self.runner.name, "running": self.engine.num_running,
                "cost_ms": self.runner.cost.to_wire(), "context_length": self.runner.context_length,
                "max_slots": self.engine.max_running, "carries_state": self.engine.prompt_cache.host is not None}

    def ping(self) -> int:
        """A call that does nothing but travel: the router times it to learn the round trip."""
        with self.emulation.travel():
            return os.getpid()

    def add(self, seq_id: str, request: GenerationRequest, options: SpeculationOptions,
            moved: Detached | None = None) -> None:
        """Queue a request (with what another replica detached, for a moved one: its KV state);
        a request the engine refuses ends with an error update."""
        with self.emulation.travel():
            self._command("add", seq_id, request, options, moved)

    def cancel(self, seq_ids: list[str]) -> None:
        with self.emulation.travel():
            for seq_id in seq_ids:
                self._command("cancel", seq_id)

    def detach(self, seq_id: str) -> Detached | None:
        """Take a sequence off this replica (the router moves it); None where it already
        finished (its last update is in the news)."""
        with self.emulation.travel():
            return self._command("detach", seq_id).result()

    def poll(self, wait_s: float = POLL_WAIT_S) -> ReplicaNews:
        """The news since the last poll, waiting up to wait_s for some."""
        with self.emulation.travel():
            with self._news:
                if not self._updates and not self._reports:
                    self._news.wait(wait_s)
                updates, self._updates = self._updates, []
                reports, self._reports = self._reports, []
            return ReplicaNews(tuple(updates), tuple(reports), self.engine.num_running, self.engine.num_waiting,
                               self.runner.cost.to_wire())

    def set_drafters(self, links: list[DrafterLink], draft_ahead: bool = False) -> None:
        """The live drafter workers; model drafts go to them (none: hybrid copies only), and with
        draft_ahead they draft round i+1 while round i verifies (remote_draft.py)."""
        with self.emulation.travel():
            self._command("drafters", None, links, draft_ahead).result()

    def clear_caches(self) -> None:
        """Forget every retained prompt cache and earlier answers (a benchmark starts each run cold)."""
        with self.emulation.travel():
            self._command("clear", None).result()

    def close(self) -> None:
        """Stop the engine thread after its step; calls still waiting for it fail."""
        with self._news:
            self._stopped = True
            self._news.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._news:
            commands, self._commands = list(self._commands), deque()
        for *_, done in commands:
            done.set_exception(TandemError("the replica is closed"))

    # -- the engine thread ------------------------------------------------------------------------

    def _command(self, kind: str, seq_id: str | None, *args) -> Future:
        done: Future = Future()
        with self._news:
            if self._stopped:
                done.set_exception(TandemError("the replica is closed"))
                return done
            self._commands.append((kind, seq_id, args, done))
            self._news.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tandem-replica", daemon=True)
                self._thread.start()
        return done

    def _run(self) -> None:
        while True:
            with self._news:
                while not self._commands and not self.engine.has_work and not self._stopped:
                    self._news.wait()
                if self._stopped:
                    return
                commands, self._commands = list(self._commands), deque()
            for command in commands:
                self._apply(*command)
            if self.engine.has_work:
                self._step()

    def _apply(self, kind: str, seq_id: str | None, args: tuple, done: Future) -> None:
        try:
            done.set_result(self._applied(kind, seq_id, args))
        except Exception as error:  # a bug here must not stop the replica's thread
            done.set_exception(error)

    def _applied(self, kind: str, seq_id: str | None, args: tuple):
        if kind == "add":
            request, options, moved = args
            host = self.engine.prompt_cache.host
            if moved is not None and moved.state is not None and host is not None:
                host.put(moved.state, moved.state_key)  # another model's state is refused by its key
            try:
                self.engine.add(seq_id, request, options)
            except TandemError as error:
                self._post([SequenceUpdate(seq_id, (), finished=True, finish_reason="error", error=str(error))], [])
        elif kind == "cancel":
            self.engine.cancel(seq_id)  # the router has already told the client
        elif kind == "detach":
            seq = self.engine.running.get(seq_id) or next((s for s in self.engine.waiting if s.seq_id == seq_id), None)
            if seq is None:
                return None
            host = self.engine.prompt_cache.host
            detached = Detached(tuple(seq.output), self._state_of(seq), host.model_key if host is not None else "")
            self.engine.cancel(seq_id)
            return detached
        elif kind == "drafters":
            self._link_drafters(args[0])
            self.remote.draft_ahead = args[1]
        elif kind == "clear":
            self.engine.clear_caches()
            self.engine.forget_answers()
        return None

    def _state_of(self, seq) -> HostEntry | None:
        """seq's target KV state, where it is prefilled and the runner can save it (never a salted
        one's: the moved state goes into the receiving replica's host tier, which all requests share)."""
        cached = self.engine.slots.cached[seq.slot] if seq.seq_id in self.engine.running else []
        if (self.engine.prompt_cache.host is None or seq.unprefilled or len(cached) < BLOCK
                or seq.request.cache_salt is not None
                or self.runner.num_cached_tokens(seq.slot) != len(cached)):
            return None
        return HostEntry(tuple(cached), self.runner.save_state(seq.slot))

    def _link_drafters(self, links: list[DrafterLink]) -> None:
        workers = []
        for link in links:
            worker = Worker(link.name, "draft", None, link.rtt_ms, delayed(link.endpoint, link.rtt_ms), alive=True,
                            cost=CostView(CostModel.from_wire(link.cost_ms)), restarts=link.incarnation)
            workers.append(worker)
        self.remote.set_drafters(workers)
        planner = self.engine.planner
        planner.draft = self.remote.drafters[0].cost if workers else None
        planner.draft_call_ms = self.remote.drafters[0].rtt_ms if workers else 0.0

    def _step(self) -> None:
        try:
            updates, report = self.engine.step()
        except Exception as error:  # a bug or a device failure: fail the batch, keep serving
            log.exception("replica step failed")  # the whole trace, remote ones included, stays in the log
            message = f"replica step failed: {client_message(error)}"
            seq_ids = [seq.seq_id for seq in [*self.engine.running.values(), *self.engine.waiting]]
            for seq_id in seq_ids:
                self.engine.cancel(seq_id)
            self._post([SequenceUpdate(s, (), finished=True, finish_reason="error", error=message) for s in seq_ids],
                       [])
            return
        self._post(updates, [report])

    def _post(self, updates: list[SequenceUpdate], reports: list[StepReport]) -> None:
        with self._news:
            self._updates += updates
            self._reports += reports
            self._news.notify_all()
