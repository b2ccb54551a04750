"""Open streams per client address: past `limit`, a client's next stream is refused (429), so one
client cannot hold every connection and queue slot the server has. The address is uvicorn's: a
proxy's `X-Forwarded-For` names the client where uvicorn trusts the proxy (127.0.0.1 by default,
`FORWARDED_ALLOW_IPS` for others); behind one it does not trust, all clients share the proxy's
address (raise --max-streams-per-client there). A local client can name any address there: this
is fairness between clients, not a security boundary."""

from collections import Counter
from collections.abc import Callable

from tandem.serve.api.errors import APIError

RETRY_AFTER_SECONDS = 1


class StreamLimit:
    def __init__(self, limit: int):
        self.limit = limit
        self.open_streams: Counter[str] = Counter()  # event-loop thread only

    def open(self, client: str) -> Callable[[], None]:
        """Count a stream for `client` (429 past the limit); returns its release, safe to call twice."""
        if self.open_streams[client] >= self.limit:
            raise APIError(429, f"this client already has {self.limit} open stream{'' if self.limit == 1 else 's'}, the server's limit per "
                           "client: finish or close one first", "rate_limit_error", code="too_many_streams",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.open_streams[client] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open_streams[client] -= 1
                if not self.open_streams[client]:
                    del self.open_streams[client]

        return release
