"""GET /v1/models (and /v1/models/{id}), GET /health, GET /metrics, GET /openapi.json.

/openapi.json is the API's schema (serve/api/openapi.py), open like /metrics unless --protect-metrics.
/health answers 200 with {"status": "ok", ...} while serving and 503 with "draining" during
shutdown, so a load balancer stops sending traffic; running/waiting are the engine's counts (waiting with the
requests submitted since its step began, which it takes between steps), in_flight every request
submitted and not yet finished. A cluster
says which workers are not up: "degraded" (200) while a verifier still serves, "unavailable" (503)
while none does, even where one is restarting (requests sent anyway wait for it).
"""

import asyncio
from collections.abc import Callable

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from tandem.serve.api.auth import require_api_key
from tandem.serve.api.errors import RETRY_AFTER_SHUTDOWN_SECONDS, APIError
from tandem.serve.state import ServerState


def models_router(state: ServerState) -> APIRouter:
    router = APIRouter(dependencies=[Depends(require_api_key(state.settings.api_key))])

    @router.get("/v1/models")
    @router.head("/v1/models", include_in_schema=False)  # probes that check the API is up (405 before)
    async def list_models():
        return {"object": "list", "data": [_model_card(state)]}

    @router.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str):
        if model_id != state.model_name:
            raise APIError(404, f"The model '{model_id}' does not exist; this server serves '{state.model_name}'.",
                           param="model", code="model_not_found")
        return _model_card(state)

    return router


def status_router(state: ServerState, openapi: Callable[[], dict]) -> APIRouter:
    router = APIRouter()
    observers_only = [Depends(require_api_key(state.settings.api_key if state.settings.protect_metrics else None))]

    @router.get("/health")
    @router.head("/health", include_in_schema=False)  # load balancers probe with either
    async def health():
        engine = state.worker.engine
        workers = engine.worker_states() if hasattr(engine, "worker_states") else []  # a cluster's
        not_up = _workers_not_up(workers)
        unavailable = getattr(engine, "unavailable_reason", None) or _no_verifier_up(not_up, workers)
        status = ("draining" if state.draining else "unavailable" if unavailable
                  else "degraded" if not_up else "ok")
        body = {"status": status, **({"reason": unavailable} if unavailable else {})}
        if not state.settings.protect_metrics:  # what it serves and how busy: the metrics' to guard (open without a key)
            body |= {"model": state.model_name, **({"workers_not_up": not_up} if not_up else {}),
                     "running": engine.num_running, "waiting": state.worker.num_waiting,
                     "in_flight": state.worker.in_flight}
        if status in ("draining", "unavailable"):  # as the 503s new requests get: a load balancer sends them elsewhere
            return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SHUTDOWN_SECONDS)})
        return JSONResponse(body)

    @router.get("/metrics", dependencies=observers_only)
    @router.head("/metrics", dependencies=observers_only, include_in_schema=False)  # a probe that it answers
    async def metrics():
        body, content_type = await asyncio.to_thread(state.metrics.render)
        return Response(body, media_type=content_type)

    @router.get("/openapi.json", dependencies=observers_only, include_in_schema=False)
    async def openapi_schema():
        return JSONResponse(openapi())

    return router


def _workers_not_up(workers: list[dict]) -> list[dict]:
    """The workers that do not answer now: name, role, and "restarting" or "down" (out of restarts)."""
    return [{"name": w["name"], "role": w["role"], "state": "restarting" if w["restarting"] else "down"}
            for w in workers if not w["alive"]]


def _no_verifier_up(not_up: list[dict], workers: list[dict]) -> str | None:
    """Why nothing serves now where every verifier is restarting (none left at all is the engine's
    own `unavailable_reason`)."""
    if not any(w["role"] == "verify" and w["alive"] for w in workers):
        restarting = [w["name"] for w in not_up if w["role"] == "verify" and w["state"] == "restarting"]
        down = [w["name"] for w in not_up if w["role"] == "verify" and w["state"] == "down"]
        if restarting:  # a verifier out of restarts was listed as restarting too
            return f"no verifier is up; restarting: {', '.join(restarting)}" + (
                f"; down for good: {', '.join(down)}" if down else "")
    return None


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "tandem",
            "max_model_len": state.context_length}
