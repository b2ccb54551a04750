"""`create_app(state)`: the FastAPI application over a running engine worker.

The app owns no engine and no threads: server.py (or a test) builds the `ServerState`, starts the
worker and runs the app. Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /health, GET /metrics, GET /openapi.json, and the dashboard at GET /. Every error is an OpenAI
error body (see serve/api/errors.py for the status codes). Browsers get CORS headers only for the
origins in --allowed-origins, and requests from other web origins are refused (origin_guard.py);
a server bound to loopback answers only requests addressed to a loopback name (host_guard.py).
"""

import functools

from fastapi import FastAPI

from tandem.serve.api.cors import JsonCORSMiddleware
from tandem.serve.api.errors import install_error_handlers
from tandem.serve.api.openapi import build_openapi
from tandem.serve.api.host_guard import LoopbackHostGuard, is_loopback_name
from tandem.serve.api.nosniff import NoSniff
from tandem.serve.api.origin_guard import OriginGuard, same_origin_form
from tandem.serve.api.routes_completions import completions_router
from tandem.serve.api.routes_info import models_router, status_router
from tandem.serve.api.trailing_slash import TrailingSlashStripped
from tandem.serve.observability.dashboard import dashboard_router
from tandem.serve.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="Tandem", summary="OpenAI-compatible speculative decoding",
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tandem = state
    install_error_handlers(app, state.metrics)
    app.include_router(completions_router(state))
    app.include_router(models_router(state))
    app.include_router(status_router(state, functools.cache(lambda: build_openapi(app))))
    settings = state.settings
    app.include_router(dashboard_router(state.metrics, settings.api_key if settings.protect_metrics else None))
    allowed_origins = tuple(same_origin_form(origin) for origin in settings.allowed_origins)  # as browsers send them
    if allowed_origins:
        # any request header (the official JS client sends X-Stainless-*: a browser's preflight was
        # refused), as vLLM and llama-server allow; the origins are what is guarded
        app.add_middleware(JsonCORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=["Retry-After"], max_age=600)
    app.add_middleware(OriginGuard, allowed=allowed_origins,  # before CORS answers a preflight
                       on_refused=lambda: state.metrics.request_rejected(403))
    app.add_middleware(TrailingSlashStripped)
    if is_loopback_name(settings.host):  # outside all but NoSniff
        app.add_middleware(LoopbackHostGuard, allowed=settings.allowed_hosts,
                           on_refused=lambda: state.metrics.request_rejected(403))
    app.add_middleware(NoSniff)  # outermost: on the guards' refusals too
    return app
