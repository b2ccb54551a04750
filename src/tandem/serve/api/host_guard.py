"""A server bound to loopback answers only requests addressed to a loopback name (403 otherwise).

DNS rebinding: a page on attacker.example re-points its own name at 127.0.0.1, and the browser,
seeing one origin, lets the page read what a keyless local server answers. Such a request still
names attacker.example in its `Host` header, which no client of a loopback server does (they
write localhost, 127.0.0.1 or [::1]). `--allowed-hosts` adds names (a reverse proxy passing its
public name on to a server bound to loopback); a server bound elsewhere was exposed on purpose
and is not guarded.
"""

import ipaddress

from tandem.serve.api.errors import send_refusal


def is_loopback_name(host: str) -> bool:
    """localhost, a name under .localhost (RFC 6761), or a loopback address (brackets allowed)."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name in a Host header, without its port: "[::1]:8000" -> "[::1]", "a.b:80" -> "a.b";
    None where the header is no name with an optional numeric port ("localhost:evil.example",
    "[::1" passed as localhost and ::1)."""
    if header.startswith("["):
        name, bracket, port = header.partition("]")
        name += bracket
        if not bracket or "[" in name[1:]:
            return None
    elif header.count(":") > 1:  # an IPv6 address without brackets: no port can follow
        name, port = header, ""
    else:
        name, colon, port = header.partition(":")
        port = colon + port
    if port and not (port.startswith(":") and (port[1:].isdigit() or port == ":")):  # RFC 3986: port = *DIGIT
        return None
    return name


class LoopbackHostGuard:
    """ASGI middleware: 403 for an HTTP request whose Host names neither a loopback name nor one
    of `allowed` ("*": every name)."""

    def __init__(self, app, allowed: tuple[str, ...], on_refused=lambda: None):
        self.app = app
        self.allowed = frozenset(name.lower() for name in allowed)
        self.on_refused = on_refused  # counts the refusal (metrics.request_rejected)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or "*" in self.allowed:
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        name = host_name(header)
        if not header or name is not None and (is_loopback_name(name) or name.lower() in self.allowed):
            return await self.app(scope, receive, send)
        self.on_refused()
        if name is None:
            return await send_refusal(send, 403, f"the Host header {header!r} is no host name with an optional "
                                      "numeric port", "host_not_allowed")
        await send_refusal(send, 403, f"this server is bound to loopback and answers only requests addressed to "
                           f"localhost or a loopback address, not {name!r} (a guard against DNS rebinding); serve "
                           f"with --allowed-hosts {name} to allow it", "host_not_allowed")
