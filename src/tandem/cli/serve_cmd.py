"""`tandem serve`: an OpenAI-compatible HTTP API (and a live dashboard) over the batching engine."""

import argparse
import os
import sys

from tandem.cli.given import StoreGiven, given_options
from tandem.cli.options import add_model_options, engine_config, engine_prefill_floor
from tandem.engine.build import MAX_RUNNING
from tandem.engine.host_cache import parse_cache_ram
from tandem.errors import TandemError
from tandem.serve.settings import (API_KEY_ENV, DEFAULT_CACHE_TTL_SECONDS, DEFAULT_MAX_BODY_BYTES,
                                   DEFAULT_MAX_STREAMS_PER_CLIENT,
                                   DEFAULT_REQUEST_TIMEOUT_SECONDS, LOG_LEVELS, ServeSettings, check_sendable_key)


# model options that describe one engine's models; with --cluster the file describes every worker's
ONE_ENGINE_OPTIONS = ("target", "draft", "backend", "device", "dtype", "draft_backend", "draft_device",
                      "draft_dtype", "threads", "context_length", "torch_runner", "kv_memory",
                      "draft_kv_memory")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve an OpenAI-compatible API with speculative decoding")
    parser.register("action", None, StoreGiven)  # --cluster refuses the one-engine options given, defaults or not
    add_model_options(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    group.add_argument("--port", default="8000", help="port (default 8000; 0 picks a free one)")
    group.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}; white space "
                       "around it, as a key file's last newline, is dropped)")
    group.add_argument("--served-model-name", default=None, help="the model name clients send (default: --target's catalog name, or a .gguf file's or folder's name without .gguf)")
    group.add_argument("--max-running", default="8",
                       help="sequences decoded together, at most 64 (default 8; with --cluster: requests in flight "
                       "at the router, up to 4096)")
    group.add_argument("--max-waiting", default="64", help="requests queued beyond those; more get 429 (default 64)")
    group.add_argument("--max-body-bytes", default=str(DEFAULT_MAX_BODY_BYTES), help="request body limit in bytes, beyond it a 413 (default %(default)s)")
    group.add_argument("--cache", default="memory", help="response and n-gram cache: memory | redis://HOST:PORT | off (default %(default)s)")
    group.add_argument("--cache-ttl", default=f"{DEFAULT_CACHE_TTL_SECONDS:g}", help="seconds a cached response lives (default %(default)s)")
    group.add_argument("--cache-ram", default=None,
                       help="host memory for the prompt cache's evicted KV states, e.g. 8G, 512M or a number of "
                       "MiB (llama-server's option); 0 turns it off (default: 8 GiB or a quarter of the RAM, "
                       "printed at start-up; llama.cpp, and torch's fused runner)")
    group.add_argument("--cache-dir", default=None,
                       help="folder for the prompt cache's disk tier: evicted and finished conversations' KV "
                       "states, kept across restarts and keyed by the model files' checksums; one server per folder "
                       "(default: off)")
    group.add_argument("--cache-disk", default=None,
                       help="disk space the disk tier may use in --cache-dir, other models' files included (they go "
                       "first), e.g. 16G or a number of MiB (default: 16 GiB or a quarter of the free space, "
                       "printed at start-up)")
    group.add_argument("--otlp-endpoint", default=None, help="OTLP/HTTP trace collector, e.g. http://localhost:4318")
    group.add_argument("--alert-threshold", default="0.3",
                       help="rolling acceptance rate under which the dashboard and /metrics raise an alert (default 0.3: "
                       "the default drafter runs at 0.5-0.6 on chat, copies at 0.8-0.9)")
    group.add_argument("--grace-seconds", default="10", help="on SIGTERM, seconds in-flight requests get to finish (default %(default)s)")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-tokens-limit", default=None,
                        help="most new tokens a request may ask for; more get 400 (default: the context)")
    limits.add_argument("--max-prompt-tokens", default=None, help="longest prompt accepted; longer get 400 "
                        "(default: the context)")
    limits.add_argument("--request-timeout", default=str(DEFAULT_REQUEST_TIMEOUT_SECONDS),
                        help="seconds a whole request may take, queueing included; then it is cancelled (504, or "
                        "an error event on a stream) (default 600)")
    limits.add_argument("--max-streams-per-client", default=str(DEFAULT_MAX_STREAMS_PER_CLIENT),
                        help="open streams one client address may hold; more get 429 (default 64; a proxy on this "
                        "host that sets X-Forwarded-For has each client counted; raise it behind a proxy uvicorn "
                        "does not trust, FORWARDED_ALLOW_IPS, where clients share its address)")
    security = parser.add_argument_group("security")
    security.add_argument("--allowed-origins", default=None,
                          help="comma-separated browser origins allowed by CORS (others get 403), e.g. https://app.example.com "
                          "(default: none, no CORS headers)")
    security.add_argument("--allowed-hosts", default=None,
                          help="comma-separated Host names a server bound to loopback answers besides localhost and "
                          "loopback addresses, e.g. a reverse proxy's public name; * for any (default: none; others "
                          "get 403, a guard against DNS rebinding)")
    security.add_argument("--protect-metrics", action="store_true",
                          help="require the API key on /metrics, /dashboard/data and /openapi.json too "
                          "(default: open, as vLLM's)")
    security.add_argument("--log-requests", action="store_true",
                          help="log each request's prompt and completion text (default: never; the key never)")
    security.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                          help="what the server logs to stderr: warning (default: problems only), info adds a "
                          "line per HTTP request (method, path, status; no texts) and the HTTP server's start and "
                          "stop, debug the libraries' own records too (request texts only with --log-requests)")
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--cluster", default=None, help="serve on the Ray workers a cluster YAML file describes")
    cluster.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    cluster.add_argument("--draft-ahead", "--pipeline", dest="draft_ahead", action="store_true",
                         help="drafter workers draft round i+1 while round i verifies (needs --cluster)")
    cluster.add_argument("--health-period", default=None,
                         help="seconds between health checks of every cluster worker (default 2)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster = cluster_options(args)
    if cluster is not None:
        _check_no_engine_options(args)
    if cluster is not None and (args.cache_dir is not None or args.cache_ram is not None or args.cache_disk is not None):
        raise TandemError("--cache-ram, --cache-dir and --cache-disk size one process's prompt cache; a cluster's "
                          "replicas have no disk tier and keep their own host tier: give a worker `cache_ram: 2G` in the cluster file "
                          "(default: an equal share of one process's default per verifier replica)")
    settings = serve_settings(args)  # after the cluster's refusals: its cache options' advice is theirs
    if cluster is None and settings.max_running > MAX_RUNNING:  # one engine's bound, said before a model loads
        raise TandemError(f"--max-running {settings.max_running}: one engine decodes at most {MAX_RUNNING} sequences "
                          "together (a cluster's router takes up to 4096 in flight, across its replicas)")
    config = engine_config(args) if cluster is None else cluster_engine_config(cluster, args)
    if cluster is not None and cluster.ray_address is None:
        from tandem.cluster.runtime.launch import prepare_models

        prepare_models(cluster.spec)  # first: a model not found is an error at its line in the file
    from tandem.serve.server import serve  # fastapi, uvicorn and the models: only when serving

    return serve(config, settings, cluster)


def cluster_options(args: argparse.Namespace):
    if args.cluster is None:
        if args.ray_address or args.health_period or args.draft_ahead:
            raise TandemError("--ray-address, --draft-ahead and --health-period need --cluster FILE")
        return None
    from tandem.cluster.runtime.health import DEFAULT_PERIOD_S, check_period
    from tandem.cluster.runtime.launch import ClusterOptions
    from tandem.cluster.config.load import load_cluster

    period = DEFAULT_PERIOD_S if args.health_period is None else check_period(_seconds(args.health_period))
    return ClusterOptions(load_cluster(args.cluster), args.ray_address, args.draft_ahead, period)


def _check_no_engine_options(args: argparse.Namespace) -> None:
    """With --cluster the file says what each worker runs: a one-engine model option given too
    would be dropped without a word, so it is refused."""
    given = [f"--{dest.replace('_', '-')}" for dest in ONE_ENGINE_OPTIONS if dest in given_options(args)]
    if given:
        raise TandemError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} one engine's models; with "
                          "--cluster each worker's model, backend, device, dtype and threads come from the "
                          "cluster file: set them there")


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise TandemError(f"--health-period must be a number of seconds, got {text!r}") from None


def cluster_engine_config(cluster, args: argparse.Namespace):
    """The served model and drafting defaults when the models live on cluster workers."""
    from tandem.models.backends import RunnerSpec
    from tandem.engine.build import EngineConfig
    from tandem.cluster.runtime.launch import check_draft_ahead
    from tandem.speculation.drafters.registry import USES_MODEL, check_drafter, default_drafter

    target = cluster.target
    filed = cluster.spec.drafter if cluster.spec.drafter != "auto" else None  # the file's, which plan and simulate read
    drafter = check_drafter(args.drafter or filed or default_drafter(cluster.has_drafter), cluster.has_drafter,
                            how_to_add="the cluster file has no worker with a draft_model")
    k = cluster.spec.k if args.k == "auto" and cluster.spec.k is not None else args.k  # --k, else the file's
    if cluster.draft_ahead:
        check_draft_ahead(drafter)
    if args.drafter is None:
        why = ("the cluster file's" if filed else
               f"the default for a cluster {'with' if cluster.has_drafter else 'without'} a draft model")
        print(f"drafter: {drafter} ({why}; --drafter chooses another)", file=sys.stderr)
    draft_worker = next((w for w in cluster.spec.workers if w.can_draft and w.drafting_model), None)
    draft = RunnerSpec(draft_worker.drafting_model, draft_worker.backend) if draft_worker else None
    return EngineConfig(RunnerSpec(target.model, target.backend, target.device, target.dtype, target.threads),
                        draft if USES_MODEL.get(drafter, False) else None, drafter, k,
                        step_token_budget=args.step_tokens,
                        prefill_floor=engine_prefill_floor(args.prefill_floor, None),  # replicas: their gap bound
                        prefill_waves=args.prefill_waves)


def api_key_of(option: str | None, environ) -> str | None:
    """--api-key, else $TANDEM_API_KEY, without the white space around it (a key read from a
    file keeps its last newline, which no client sends: every request got a 401). A blank key
    is refused, naming where it came from."""
    key, source = (option, "--api-key") if option is not None else (environ.get(API_KEY_ENV), f"${API_KEY_ENV}")
    if key is None:
        return None
    if not key.strip():
        raise TandemError(f"{source} is empty: leave it out (unset it) to serve without a key")
    check_sendable_key(key.strip(), source)  # named by where it came from; ServeSettings checks it again
    return key.strip()


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    return ServeSettings(
        host=args.host[1:-1] if args.host[:1] + args.host[-1:] == "[]" else args.host,  # [::1], as a URL writes it
        port=_parse(int, "--port", args.port),
        api_key=api_key_of(args.api_key, os.environ),
        max_body_bytes=_parse(int, "--max-body-bytes", args.max_body_bytes),
        max_running=_parse(int, "--max-running", args.max_running),
        max_waiting=_parse(int, "--max-waiting", args.max_waiting),
        cache_url=args.cache,
        cache_ttl_seconds=_parse(float, "--cache-ttl", args.cache_ttl),
        otlp_endpoint=args.otlp_endpoint,
        alert_threshold=_parse(float, "--alert-threshold", args.alert_threshold),
        served_model_name=args.served_model_name,
        grace_seconds=_parse(float, "--grace-seconds", args.grace_seconds),
        max_tokens_limit=_optional(int, "--max-tokens-limit", args.max_tokens_limit),
        max_prompt_tokens=_optional(int, "--max-prompt-tokens", args.max_prompt_tokens),
        request_timeout_seconds=_parse(float, "--request-timeout", args.request_timeout),
        max_streams_per_client=_parse(int, "--max-streams-per-client", args.max_streams_per_client),
        allowed_origins=tuple(o.strip() for o in (args.allowed_origins or "").split(",") if o.strip()),
        allowed_hosts=tuple(h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()),
        protect_metrics=args.protect_metrics,
        log_requests=args.log_requests,
        log_level=args.log_level,
        cache_ram_bytes=_size("--cache-ram", args.cache_ram),
        cache_dir=args.cache_dir,
        cache_disk_bytes=_size("--cache-disk", args.cache_disk),
    )


def _size(option: str, text: str | None) -> int | None:
    """A memory size option's bytes (None where not given); its errors name the option."""
    if text is None:
        return None
    try:
        return parse_cache_ram(text)
    except TandemError as error:
        raise TandemError(f"{option}: {error}") from None


def _optional(kind: type, option: str, text: str | None):
    return None if text is None else _parse(kind, option, text)


def _parse(kind: type, option: str, text: str):
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise TandemError(f"{option} must be {noun}, got {text!r}") from None
