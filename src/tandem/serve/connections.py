"""The server's client connections: a bound on the wait for a request's headers, as many open
files as the system lets the process have, and refused accepts said once a while.

uvicorn times a connection out only after a response (`timeout_keep_alive`), and not at all
while it sends part of its headers: a client that connects and sends nothing, or a request line
and then nothing, held its socket for ever, and enough of them took every file handle the
process had (then asyncio logged each refused accept, thousands of lines a second, and /health
went unanswered). Here a connection must finish its headers within HEADER_TIMEOUT_S of opening,
or of its last response; then it is closed. The body has its own bound (--request-timeout, 408).

A response sent before its request's body was all read (a 413 for a body too large, a 408, a
404 or 401 answered from the headers) ends the connection: uvicorn dropped the rest of such a
body as it came and re-armed its keep-alive clock at each packet, so a client trickling bytes
after its error held the socket for ever. The server half-closes at once (the client reads the
answer and its end), drops what still comes for LINGER_S, then closes: closing at once, with
body bytes arriving, could reset the connection before the client read its answer (nginx's
lingering close). A request framed both by Content-Length and Transfer-Encoding is answered
and its connection closed, as RFC 9112 asks (a proxy in front may have read its body otherwise).
"""

import logging
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tandem.said_now import SaidNow

HEADER_TIMEOUT_S = 30.0  # as nginx's client_header_timeout is 60 s and Node's headersTimeout 60 s
LINGER_S = 2.0  # after an answer sent before its body was read: a client's time to read it while it still sends
ACCEPT_ERROR_INTERVAL_S = 10.0  # at most one log line this often while accepts fail for want of file handles
log = logging.getLogger(__name__)


class HeaderTimedH11Protocol(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    linger_s = LINGER_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_deadline = None
        self._linger_deadline = None
        self._start_header_clock()

    def connection_lost(self, exc) -> None:
        self._stop_header_clock()
        if self._linger_deadline is not None:
            self._linger_deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger_deadline is not None:
            return  # after an early answer: what still comes is dropped, never read as a request
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request's headers are in
            self._stop_header_clock()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and _framed_twice(cycle.scope):
            # RFC 9112 6.1: closed once answered, before the bytes behind it (a smuggled request,
            # where a proxy framed it otherwise) are read
            cycle.keep_alive = False

    def on_response_complete(self) -> None:
        early = self.conn.their_state is h11.SEND_BODY  # answered before its body was all read
        super().on_response_complete()  # (which may start a pipelined request's cycle)
        if early and not self.transport.is_closing():
            self._linger()  # the rest of the body is not waited for
            return
        self._start_header_clock()  # the next request's, on a kept-alive connection

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn's own line only: its second, advice to install a WebSocket library, is wrong
        for a server with no WebSocket routes (a client's upgrade is answered as plain HTTP)."""
        self.logger.warning("Unsupported upgrade request.")

    def _linger(self) -> None:
        """Half-close after the answer, drop what still comes, close after linger_s (module notes)."""
        self._stop_header_clock()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self._linger_deadline is None:
            self._linger_deadline = self.loop.call_later(self.linger_s, self.transport.close)

    def _start_header_clock(self) -> None:
        self._stop_header_clock()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _stop_header_clock(self) -> None:
        if getattr(self, "_header_deadline", None) is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def _framed_twice(scope: dict | None) -> bool:
    """Whether the request said both Content-Length and Transfer-Encoding: the server must close
    the connection after answering it (RFC 9112, section 6.1)."""
    names = {name.lower() for name, _ in (scope or {}).get("headers", ())}
    return b"content-length" in names and b"transfer-encoding" in names


def raise_open_file_limit() -> int:
    """The soft limit on open files raised to the hard one (as vLLM does): each client is a
    socket, and the default soft limit is often 1,024. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft


class AcceptErrorsSaidOnce:
    """A loop exception handler: a refused accept (out of file handles) is logged once each
    ACCEPT_ERROR_INTERVAL_S with how many there were, not once per try with a traceback (asyncio
    logged ~16,800 lines a second, 282 MB in 40 s); everything else goes to the default."""

    def __init__(self, clock=time.monotonic):
        self.said_now = SaidNow(ACCEPT_ERROR_INTERVAL_S, clock)

    def __call__(self, loop, context: dict) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            loop.default_exception_handler(context)
            return
        said = self.said_now.event()
        if said is not None:
            since = "" if said.since_s is None else f" in the last {said.since_s:.0f} s"
            log.error("refusing new connections, out of file handles (%s): %d refused%s; the open ones: "
                      "process_open_fds on /metrics", context.get("exception"), said.events, since)


CLIENT_MISTAKES_SAID_EVERY_S = 60.0
CLIENT_MISTAKE_PREFIXES = ("Invalid HTTP request received", "Unsupported upgrade request")


class ClientMistakesSaidOnce(logging.Filter):
    """A filter on uvicorn's logger: its warning for a client's malformed request or unsupported
    upgrade, which any client may send on every connection, passes once each
    CLIENT_MISTAKES_SAID_EVERY_S per kind, with how many went unsaid since (a loop of garbage
    requests wrote a line each); every other record passes."""

    def __init__(self, clock=time.monotonic):
        super().__init__()
        self.said_now = {kind: SaidNow(CLIENT_MISTAKES_SAID_EVERY_S, clock) for kind in CLIENT_MISTAKE_PREFIXES}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = next((p for p in CLIENT_MISTAKE_PREFIXES if str(record.msg).startswith(p)), None)
        if kind is None:
            return True
        said = self.said_now[kind].event()
        if said is None:
            return False
        unsaid = said.events - 1
        record.msg = f"{record.getMessage()} (a client's; {unsaid} more since the last such line, " \
                     f"said at most once a minute)" if unsaid else \
                     f"{record.getMessage()} (a client's; said at most once a minute)"
        record.args = ()
        return True
