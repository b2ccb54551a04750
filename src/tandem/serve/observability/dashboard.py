"""The live dashboard: one HTML page, hand-written JS drawing on <canvas>, no third-party code.

Routes: `GET /` and `GET /dashboard` (the page), `GET /dashboard/data` (`ServingMetrics.snapshot()`
as JSON; the page polls it every second) and `GET /dashboard/static/{name}` (the page's script and
stylesheet, from the package's serve/static folder). The page links its assets and data with
relative URLs, so it also works when the router is included under a prefix. With
`--protect-metrics` the data needs the API key (the page and its assets stay open: they hold no
data); the page reads it from its URL fragment, `/#key=KEY`.
"""

from importlib import resources

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response

from tandem.serve.api.auth import require_api_key
from tandem.serve.observability.metrics import ServingMetrics

STATIC_TYPES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
NO_CACHE = {"Cache-Control": "no-store"}
# no other site may frame the page (clickjacking); its own script runs as it is (a script-src
# 'self' policy also stopped the browser tests' own probes, which evaluate strings)
PAGE_HEADERS = {**NO_CACHE, "X-Frame-Options": "DENY", "Content-Security-Policy":
                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"}


def dashboard_router(metrics: ServingMetrics, data_key: str | None = None) -> APIRouter:
    static = resources.files("tandem.serve") / "static"
    page = static.joinpath("index.html").read_text(encoding="utf-8")
    assets = {name: static.joinpath(name).read_bytes() for name in STATIC_TYPES}
    router = APIRouter(tags=["dashboard"])

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    @router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    def dashboard_page() -> HTMLResponse:
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @router.get("/dashboard/data", dependencies=[Depends(require_api_key(data_key))])
    def dashboard_data() -> JSONResponse:  # a plain def: FastAPI runs it off the event loop
        return JSONResponse(metrics.snapshot(), headers=NO_CACHE)

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    def dashboard_asset(name: str) -> Response:
        if name not in assets:
            raise HTTPException(status_code=404, detail=f"no dashboard asset named {name!r}")
        return Response(assets[name], media_type=STATIC_TYPES[name])

    return router
