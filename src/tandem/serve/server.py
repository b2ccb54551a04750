"""`tandem serve`: load the models, start the engine thread, serve the API until SIGINT/SIGTERM.

Order: the port is bound first, so that a taken port is an error at once, not after minutes of
loading; then tokenizer, engine (models loaded) and worker; then what loading left is frozen
out of the garbage collector's walks (`settle_heap`); then uvicorn listens on it, so a
client never reaches a server that cannot answer yet (until then a connection is refused, as if
nothing were there). `--port 0` binds any free port, and the banner naming the real URL is
printed once uvicorn accepts connections. A SIGINT or SIGTERM before then stops the start (exit
130), a cluster's Ray processes with it. Shutdown, on the first SIGINT or SIGTERM (or SIGHUP,
unless nohup ignores it): new requests get 503 (and /health says "draining"), in-flight requests get
`grace_seconds` to finish (then they are cancelled), then uvicorn closes and the process exits 0.
A second signal cuts the grace short: in-flight requests are cancelled at once (a stream ends
with an error event, others get 503) and the process exits 0 as before. A third one stops
without waiting for anything.
"""

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import sys
import threading
from pathlib import Path

import anyio
import uvicorn

from tandem.engine.build import EngineConfig, build_engine, runner_identity
from tandem.engine.events import SpeculationOptions
from tandem.engine.worker import EngineWorker
from tandem.errors import TandemError
from tandem.models.checksum import model_checksum, model_version
from tandem.models.resolve import tokenizer_digest, tokenizer_path
from tandem.serve.api.app import create_app
from tandem.serve.api.host_guard import is_loopback_name
from tandem.serve.connections import (AcceptErrorsSaidOnce, ClientMistakesSaidOnce, HeaderTimedH11Protocol,
                                      raise_open_file_limit)
from tandem.serve.observability.metrics import ServingMetrics
from tandem.serve.observability.process_stats import track_process
from tandem.serve.observability.tracing import RequestTracer
from tandem.serve.response_cache.cache import open_response_cache, response_cache_key
from tandem.serve.response_cache.store import ResponseStore
from tandem.serve.settings import API_KEY_ENV, CACHE_OFF, ServeSettings, cache_budget_warnings
from tandem.serve.state import ServerState
from tandem.sigterm import sigterm_interrupts
from tandem.speculation.drafters.registry import DRAFTER_NAMES
from tandem.speculation.shared_store.store import open_ngram_store
from tandem.text.tokenizer import TextTokenizer

SOCKET_BACKLOG = 2048  # uvicorn's own default backlog
UVICORN_CLOSE_SECONDS = 5  # after the drain, how long uvicorn waits for connections to close
FEW_OPEN_FILES = 1024  # an open-file limit below this is said at start (the usual soft default)


def serve(config: EngineConfig, settings: ServeSettings, cluster=None) -> int:
    configure_logging(settings)
    warn_if_exposed(settings)
    model_name = settings.served_model_name or default_model_name(config.target.model)
    sock = bind_socket(settings.host, settings.port)  # bound, not listening: refused until uvicorn runs
    if cluster is None:
        print(config.loading_note, file=sys.stderr, flush=True)
    ngram_store = open_ngram_store(None if settings.cache_url == CACHE_OFF else settings.cache_url,
                                   namespace=ngram_namespace(config, model_name))
    try:
        with sigterm_interrupts(hang_up=True):  # until it listens, SIGTERM (SIGHUP) stops the start as Ctrl-C
            state = build_state(config, settings, model_name, ngram_store, cluster)
        settle_heap()
        try:
            warn_if_few_files(raise_open_file_limit())
            claim(sock, settings.host)
            server = DrainingServer(state, uvicorn.Config(
                create_app(state), log_level=settings.log_level, log_config=UVICORN_LOG_CONFIG,
                access_log=settings.log_level in ("info", "debug"), http=HeaderTimedH11Protocol,
                ws="none",  # no WebSocket routes: an upgrade is a plain request, whatever is installed
                timeout_graceful_shutdown=UVICORN_CLOSE_SECONDS))
            asyncio.run(_serve(server, sock, _banner(model_name, settings.host, sock.getsockname()[1],
                                                     settings.protect_metrics)))
        finally:
            close_state(state)
    finally:
        ngram_store.close()
        sock.close()
    return 0


def warn_if_few_files(limit: int) -> None:
    """One line where the open-file limit, raised as far as it goes, leaves room for few clients
    (each connection is a file; `ulimit -n 64` served a handful, then refused the rest)."""
    if limit != resource.RLIM_INFINITY and limit < FEW_OPEN_FILES:
        print(f"warning: this process may open only {limit} files (ulimit -n; its hard limit): each client "
              f"connection takes one, and past them new connections wait; raise the hard limit "
              f"for more clients", file=sys.stderr)


def settle_heap() -> None:
    """What loading left (the libraries, the models' objects) lives as long as the server: freed
    of its garbage once, it is moved out of the collector's reach, so that the full collections
    serving triggers walk only what serving made (one took 0.11 s of the engine's thread in a
    ~60 s run of 20 short answers, 2026-11-28, AMD EPYC; none did after this)."""
    gc.collect()
    gc.freeze()


def build_state(config: EngineConfig, settings: ServeSettings, model_name: str, ngram_store,
                cluster=None) -> ServerState:
    """Load the tokenizer and models and start the engine thread (slow: the port is bound, not yet listening).
    With `cluster` (cluster/runtime/launch.py's ClusterOptions) the models load on Ray workers instead."""
    tokenizer = TextTokenizer(str(tokenizer_path(config.target.model)))
    metrics = ServingMetrics(model_name, settings.alert_threshold)
    tracer = RequestTracer(settings.otlp_endpoint)
    engine = _engine(config, settings, ngram_store, cluster, model_name)
    cache = _response_store(settings, config)
    worker = EngineWorker(engine, settings.max_waiting, observers=[metrics.observe_step, tracer.observe_step],
                          queue_observers=[metrics.observe_queue])
    metrics.watch_queue(lambda: engine.num_running, lambda: worker.num_waiting)  # as /health counts them
    track_process(metrics.registry, model_name, lambda: engine.kv_slots_in_use)
    if hasattr(engine, "prompt_cache"):  # a cluster's replicas keep their own
        print(engine.prompt_cache.describe(), file=sys.stderr)
        for warning in cache_budget_warnings(settings):
            print(f"warning: {warning}", file=sys.stderr)
    metrics.watch_prompt_cache(lambda: getattr(engine, "host_cache_bytes", 0),
                               lambda: getattr(engine, "disk_cache_bytes", 0))
    metrics.watch_drafting_memory(lambda: getattr(engine, "answers_bytes", 0))  # a cluster's replicas keep theirs
    health = getattr(engine, "health", None)  # a cluster: workers' states between steps too
    if health is not None:
        # the router's view: each worker's state with its placements by reason (the health check's lacks them)
        health.listeners.append(lambda _states: metrics.observe_workers(engine.worker_states()))
    return ServerState(worker.start(), tokenizer, model_name, engine.context_length, settings, metrics, tracer,
                       cache, drafters=tuple(n for n in DRAFTER_NAMES if n in engine.drafters),
                       speculation_defaults=SpeculationOptions(config.drafter, config.k))


def _response_store(settings: ServeSettings, config: EngineConfig) -> ResponseStore:
    """Keys name the served model and what computes it: a Q4 GGUF and fp32 weights answer
    differently, so servers sharing a Redis never serve each other's entries."""
    if settings.cache_url == CACHE_OFF:
        return ResponseStore.disabled()
    shared = settings.cache_url not in (None, "memory")  # Redis: other servers, other files, later
    identity = model_identity(config, by_content=shared)

    def key(model: str, prompt_ids, params: dict):
        return response_cache_key(f"{model}|{identity}", prompt_ids, params)

    return ResponseStore(open_response_cache(settings.cache_url, settings.cache_ttl_seconds), key)


def model_identity(config: EngineConfig, by_content: bool = False) -> str:
    """What the target's answers depend on: the model, its backend, device, precision and, for
    llama.cpp, its build. The model is its catalog checksum; a local file is, `by_content`, the
    SHA-256 of its bytes (for Redis, whose entries outlive a server and reach other machines: a
    copy with its times kept, or another fine-tune of the same size, must not hit; hashed once
    per start), else its path, size and time (the in-memory cache: one process, one model
    loaded; nothing hashed, so a start stays fast)."""
    return runner_identity(config.target, model_checksum if by_content else model_version)


def _engine(config: EngineConfig, settings: ServeSettings, ngram_store, cluster, model_name: str):
    if cluster is None:
        return build_engine(config, max_running=settings.max_running, ngram_store=ngram_store,
                            cache_ram_bytes=settings.cache_ram_bytes, cache_dir=settings.cache_dir,
                            cache_disk_bytes=settings.cache_disk_bytes)
    from tandem.cluster.runtime.launch import launch_cluster
    from tandem.cluster.runtime.replica import ReplicaSettings

    replica = ReplicaSettings(ngram_store_url=None if settings.cache_url == CACHE_OFF else settings.cache_url,
                              ngram_namespace=ngram_namespace(config, model_name),
                              step_token_budget=config.step_token_budget,
                              prefill_floor=config.prefill_floor, prefill_waves=config.prefill_waves)
    return launch_cluster(cluster.spec, config.drafter, config.k, cluster.ray_address, settings.max_running,
                          cluster.health_period_s, cluster.draft_ahead, replica)


def close_state(state: ServerState) -> None:
    state.draining = True
    state.worker.shutdown(0)  # a no-op when the drain already stopped the engine thread
    state.cache.close()
    state.tracer.shutdown()


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# uvicorn's own records (its errors, the access log) go to the root logger's one stderr handler in
# the same format: by default they had formats of their own, without a time, the access log on stdout
UVICORN_LOG_CONFIG = {"version": 1, "disable_existing_loggers": False,
                      "loggers": {name: {"handlers": [], "propagate": True}
                                  for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}}


def configure_logging(settings: ServeSettings) -> None:
    """Records at --log-level and above to stderr (warnings and errors by default); request texts
    (INFO on tandem.requests) only with --log-requests, whatever the level."""
    level = getattr(logging, settings.log_level.upper())
    logging.basicConfig(level=level, format=LOG_FORMAT)
    logging.getLogger().setLevel(level)  # basicConfig leaves a root that has handlers (a test's) as it was
    logging.getLogger("tandem.requests").setLevel(logging.INFO if settings.log_requests else logging.WARNING)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientMistakesSaidOnce) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(ClientMistakesSaidOnce())


def warn_if_exposed(settings: ServeSettings) -> None:
    """Beyond loopback without a key, anyone who reaches the port can use the model: say so."""
    if settings.api_key is None and not is_loopback_name(settings.host):
        print(f"warning: serving on {settings.host} without --api-key: anyone who can reach this port can use "
              f"the model. Set --api-key (or ${API_KEY_ENV}), or bind 127.0.0.1.", file=sys.stderr, flush=True)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on host:port (port 0: any free port); TandemError if it is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise TandemError(f"cannot listen on {host_port(host, port)}: {error.strerror or error}") from None
    return sock


def host_port(host: str, port: int) -> str:
    """host:port as a URL writes it: an IPv6 address in brackets ([::]:8000, not :::8000)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def claim(sock: socket.socket, host: str) -> None:
    """Listen, once the server is ready to answer: the port is bound early but taken only now
    (clients are refused while models load), and a second server may have bound it meanwhile
    (SO_REUSEADDR lets two sockets bind while neither listens): the one that listens first wins,
    the other stops with one line (it died after loading with uvicorn's traceback, exit 1)."""
    try:
        sock.listen(SOCKET_BACKLOG)
    except OSError as error:
        port = sock.getsockname()[1]
        raise TandemError(f"cannot listen on {host_port(host, port)}: {error.strerror or error} (another server "
                          "took the port while the models loaded)") from None


def ngram_namespace(config: EngineConfig, model_name: str) -> str:
    """Where the shared n-gram store keeps this server's n-grams (in Redis, shared with other
    servers): they are token ids, so the served name and what the ids mean (the tokenizer's files)."""
    return f"{model_name}:{tokenizer_digest(config.target.model)}"


def default_model_name(target: str) -> str:
    """The catalog name as given; for a file or folder, its name without .gguf."""
    path = Path(target)
    return path.stem if path.suffix == ".gguf" else path.name or target


EXIT_INTERRUPTED = 130  # a third signal's exit, as an interrupted command's


class DrainingServer(uvicorn.Server):
    """uvicorn's server with Tandem's shutdown: drain the engine first, then close the sockets."""

    def __init__(self, state: ServerState, config: uvicorn.Config):
        super().__init__(config)
        self.state = state
        self.hurried = False  # a second signal came during the drain
        self.loop: asyncio.AbstractEventLoop | None = None  # the one serving, once it runs

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's SIGINT and SIGTERM, and SIGHUP taken as SIGTERM: a closed terminal or a
        supervisor's hangup drains (by default it ended the process at once, in-flight answers cut
        and the prompt cache unsaved). Where SIGHUP is ignored (nohup), it stays ignored."""
        with super().capture_signals():
            hang_up = getattr(signal, "SIGHUP", None)
            if (hang_up is None or threading.current_thread() is not threading.main_thread()
                    or signal.getsignal(hang_up) is signal.SIG_IGN):
                yield
                return
            previous = signal.signal(hang_up, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(hang_up, previous if previous is not None else signal.SIG_DFL)

    def handle_exit(self, sig, frame) -> None:
        if self.hurried:  # a third signal: stop at once (uvicorn's force_exit logged a CancelledError traceback)
            _say("stopped at once (a third signal)")
            with contextlib.suppress(OSError):
                sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)
        elif self.state.draining:  # a second one: no more grace
            self.hurried = True
            _say("shutting down now: cancelling in-flight requests")
            self.state.worker.cut_grace()
        else:
            self.state.draining = True
            if self.state.drain_started is not None and self.loop is not None:  # a signal handler: not in the loop
                self.loop.call_soon_threadsafe(self.state.drain_started.set)
            threading.Thread(target=self._drain, name="tandem-drain", daemon=True).start()

    def _drain(self) -> None:
        """Finish in-flight requests, then stop serving, whatever fails on the way (a log pipe
        closed under it left the server draining, answering 503, for good)."""
        try:
            grace = self.state.settings.grace_seconds
            in_flight = self.state.worker.in_flight
            _say(f"shutting down: finishing {in_flight} in-flight request{'' if in_flight == 1 else 's'} "
                 f"(up to {grace:g}s)" if in_flight else "shutting down: no request in flight")
            self.state.worker.shutdown(grace)
        finally:
            self.should_exit = True


async def _serve(server: DrainingServer, sock, banner: str) -> None:
    server.loop = asyncio.get_running_loop()
    server.loop.set_exception_handler(AcceptErrorsSaidOnce())
    await anyio.sleep(0)  # loads anyio's asyncio backend now: at the first stream, out of file handles, it failed
    server.state.drain_started = asyncio.Event()
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        print(banner, flush=True)
    await serving


def _say(line: str) -> None:
    """A line on stderr during shutdown, where a reader that went away (a log pipe closed) must not
    stop the shutdown."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def _banner(model_name: str, host: str, port: int, protected: bool = False) -> str:
    """The line saying where it serves; with --protect-metrics, how the dashboard takes the key."""
    shown = f"[{host}]" if ":" in host else host
    key = " (add #key=YOUR_API_KEY to its address: --protect-metrics)" if protected else ""
    return f"Tandem serving {model_name} at http://{shown}:{port}/v1 — dashboard: http://{shown}:{port}/{key}"
