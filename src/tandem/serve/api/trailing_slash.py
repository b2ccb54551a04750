"""Routes answer with or without a trailing slash (`POST /v1/chat/completions/`), as OpenAI's and
vLLM's do. Without this a slash got starlette's empty-bodied 307 redirect, which clients that do
not follow redirects for POST read as a failure with nothing to say."""


class TrailingSlashStripped:
    """ASGI middleware: an HTTP path other than "/" loses its trailing slashes before routing."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                stripped = path.rstrip("/") or "/"
                raw = scope.get("raw_path")
                scope = {**scope, "path": stripped}
                if raw is not None:
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)
