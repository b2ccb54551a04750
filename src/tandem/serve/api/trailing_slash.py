"""Routes answer with or without a trailing slash (`POST /v1/chat/completions/`), as OpenAI's and
vLLM's do. Without this a slash got starlette's empty-bodied 307 redirect, which clients that do
not follow redirects for POST read as a failure with nothing to say.

A page is the exception: the dashboard's page loads its script, style and data by relative URLs,
which a browser resolves against `/dashboard/` to `/dashboard/dashboard/...`. So `GET /dashboard/`
is redirected to `/dashboard` by a relative Location (`../dashboard`), which keeps any prefix a
reverse proxy serves the server under."""

PAGES = ("/dashboard",)  # paths whose page loads relative URLs: redirected, not stripped


class TrailingSlashStripped:
    """ASGI middleware: an HTTP path other than "/" loses its trailing slashes before routing;
    a page's path gets a redirect to it instead."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                stripped = path.rstrip("/") or "/"
                if stripped in PAGES and scope["method"] in ("GET", "HEAD"):
                    await _redirect(send, "../" * (len(path) - len(stripped)) + stripped.rsplit("/", 1)[-1],
                                    scope.get("query_string", b""))
                    return
                raw = scope.get("raw_path")
                scope = {**scope, "path": stripped}
                if raw is not None:
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


async def _redirect(send, location: str, query: bytes) -> None:
    target = location.encode() + (b"?" + query if query else b"")
    await send({"type": "http.response.start", "status": 308,
                "headers": [(b"location", target), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
