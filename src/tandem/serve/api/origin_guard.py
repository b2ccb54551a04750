"""Requests from web pages on other origins are refused (403) unless --allowed-origins names them.

Browsers send `Origin` with every cross-origin request, and a "simple" POST (a form, or
`text/plain` JSON) reaches the server without a CORS preflight: any page a user visits could make
a keyless server on their machine generate. CORS headers only decide whether that page may read
the answer, so the guard turns such requests away before any work. Requests without `Origin`
(curl, SDKs, servers) and same-origin ones (the dashboard) pass.
"""

from tandem.serve.api.errors import send_refusal
from tandem.serve.settings import ORIGIN


class OriginGuard:
    """ASGI middleware: 403 for an HTTP request whose Origin is neither its own (scheme://Host)
    nor one of `allowed` ("*" allows every origin), default ports and case aside. Behind a TLS proxy the
    scheme is the proxy's `X-Forwarded-Proto` (uvicorn trusts it from 127.0.0.1)."""

    def __init__(self, app, allowed: tuple[str, ...], on_refused=lambda: None):
        self.app = app
        self.allowed = frozenset(same_origin_form(origin) for origin in allowed)
        self.on_refused = on_refused  # counts the refusal (metrics.request_rejected)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or "*" in self.allowed:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1")
        own = f"{scope.get('scheme', 'http')}://{headers.get(b'host', b'').decode('latin-1')}"
        if not origin or _same_origin(origin, own) or same_origin_form(origin) in self.allowed:
            return await self.app(scope, receive, send)
        self.on_refused()
        # the option only where it takes the origin: never "null" (any sandboxed frame sends it)
        advice = (f"; serve with --allowed-origins {origin} to allow them" if ORIGIN.match(origin) else
                  " (an origin that --allowed-origins cannot name: a page of that kind is never allowed)")
        await send_refusal(send, 403, f"requests from the web origin {origin} are refused{advice}", "origin_not_allowed")


DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def _same_origin(origin: str, own: str) -> bool:
    """Equal once a scheme's default port is left out (`Host: localhost:80` is http://localhost),
    and case aside (a scheme and a host name are case-insensitive)."""
    return same_origin_form(origin) == same_origin_form(own)


def same_origin_form(origin: str) -> str:
    """An origin as a browser sends it: lower case, without its scheme's default port ("*" stays)."""
    origin = origin.lower()
    scheme = origin.partition("://")[0]
    port = DEFAULT_PORTS.get(scheme)
    return origin[: -len(port)] if port and origin.endswith(port) else origin
