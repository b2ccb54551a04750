"""Client connections (serve/connections.py), over real sockets to uvicorn in a thread: a
connection that does not finish its headers in time is closed; one that did is not, however
slowly its body comes; refused accepts are logged once a while."""

import logging
import socket
import threading
import time

import pytest
import uvicorn

from tandem.serve.connections import AcceptErrorsSaidOnce, HeaderTimedH11Protocol

HEADER_TIMEOUT_S = 0.3


class QuickHeaders(HeaderTimedH11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    linger_s = 0.3


async def echo_length(scope, receive, send):
    """Answers the body's length once all of it came; /early answers 413 without reading it."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/early":
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(echo_length, log_level="warning", http=QuickHeaders, ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the server closed `conn` (an empty read) within `seconds`."""
    conn.settimeout(seconds)
    try:
        return conn.recv(1024) == b""
    except TimeoutError:
        return False


@pytest.mark.parametrize("sent", [b"", b"POST / HTTP/1.1\r\nHost: local"])
def test_a_connection_that_does_not_finish_its_headers_is_closed(port, sent):
    """One that sent nothing, or stopped mid-headers, was held for ever (600 of them: 611 files)."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(sent)
    started = time.monotonic()
    assert closed_within(conn, 5)
    assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - started < 3


def test_headers_in_time_are_answered_however_slowly_the_body_comes_and_the_next_request_gets_its_own_clock(port):
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST / HTTP/1.1\r\nHost: local\r\nContent-Length: 10\r\n\r\n12345")
    time.sleep(3 * HEADER_TIMEOUT_S)  # the body is --request-timeout's to bound, not the header clock's
    conn.sendall(b"67890")
    conn.settimeout(5)
    answer = b""
    while not answer.endswith(b"\r\n\r\n10"):
        answer += conn.recv(1024)
    conn.sendall(b"GET / HTTP/1.1\r\nHost: local")  # a kept-alive connection's next request, never finished
    assert closed_within(conn, 5)


def test_a_response_sent_before_the_body_was_read_ends_the_connection(port):
    """A 413 (or 408, 404) answered from the headers: a client trickling the rest of its body
    afterwards kept the connection for ever (each packet re-armed uvicorn's keep-alive clock).
    Now the client reads the answer and then the connection's end, and the server closes its
    socket after lingering (a send then fails)."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST /early HTTP/1.1\r\nHost: local\r\nContent-Length: 1000000\r\n\r\n12345")
    answer = read_head(conn)
    assert answer.startswith(b"HTTP/1.1 413")
    assert closed_within(conn, 1), "no end of the connection after the early answer"
    deadline = time.monotonic() + 3
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        while time.monotonic() < deadline:
            conn.sendall(b"x")  # the client still sending its body
            time.sleep(0.05)


def test_a_request_framed_by_both_length_and_chunks_is_answered_then_closed(port):
    """RFC 9112 6.1: a server that answers such a request must close the connection after it
    (it was kept alive: a request smuggled behind a proxy that read the framing otherwise)."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST / HTTP/1.1\r\nHost: local\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"3\r\nabc\r\n0\r\n\r\n")
    conn.settimeout(5)
    answer = b""
    while not answer.endswith(b"\r\n\r\n3"):
        answer += conn.recv(1024)
    assert answer.startswith(b"HTTP/1.1 200")
    assert closed_within(conn, HEADER_TIMEOUT_S / 2)  # at once, not when the next request's header clock ends


def read_head(conn: socket.socket, seconds: float = 5) -> bytes:
    """What the server sent up to the end of a response's head (and any bytes behind it)."""
    conn.settimeout(seconds)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(1024)
    return answer


def read_until_closed(conn: socket.socket, seconds: float = 5) -> bytes:
    conn.settimeout(seconds)
    received = b""
    try:
        while chunk := conn.recv(4096):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def test_a_request_smuggled_behind_a_doubly_framed_one_is_never_read(port):
    """The close came after uvicorn had started the pipelined request behind it (the one a
    proxy framed otherwise): both were answered."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST / HTTP/1.1\r\nHost: local\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"0\r\n\r\nGET /admin HTTP/1.1\r\nHost: local\r\n\r\n")
    received = read_until_closed(conn)
    assert received.count(b"HTTP/1.1 ") == 1 and received.endswith(b"\r\n\r\n0"), received


def test_a_request_sent_while_lingering_after_an_early_answer_is_not_run(port):
    """Bytes after an early answer are dropped unparsed, so a request behind the rest of the
    body is never run (a guard: uvicorn starts no new cycle there today either)."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST /early HTTP/1.1\r\nHost: local\r\nContent-Length: 10\r\n\r\n12345")
    answer = read_head(conn)
    conn.sendall(b"67890GET / HTTP/1.1\r\nHost: local\r\nContent-Length: 0\r\n\r\n")
    assert (answer + read_until_closed(conn)).count(b"HTTP/1.1 ") == 1


def test_a_websocket_upgrade_is_one_warning_without_install_advice(port):
    """It wrote two lines, the second telling the operator to install a WebSocket library for a
    server that has no WebSocket routes."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"GET / HTTP/1.1\r\nHost: local\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        conn.settimeout(5)
        assert conn.recv(1024).startswith(b"HTTP/1.1 200")  # answered as plain HTTP
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert lines == ["Unsupported upgrade request."], lines


def test_refused_accepts_are_said_once_a_while_with_their_count(caplog):
    clock = [0.0]
    handler = AcceptErrorsSaidOnce(clock=lambda: clock[0])
    other = []
    loop = type("Loop", (), {"default_exception_handler": lambda self, context: other.append(context)})()
    refused = {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")}
    with caplog.at_level(logging.ERROR, logger="tandem.serve.connections"):
        for step in range(1000):
            clock[0] = step * 0.015  # 15 s of refusals
            handler(loop, refused)
        handler(loop, {"message": "something else"})
    assert len(caplog.records) == 2 and "out of file handles" in caplog.records[0].getMessage()
    assert caplog.records[1].getMessage().endswith(": 667 refused in the last 10 s; the open ones: "
                                                   "process_open_fds on /metrics")
    assert other == [{"message": "something else"}]


def test_a_clients_malformed_requests_are_said_once_a_minute_with_a_count():
    """Garbage on a raw connection, or a WebSocket upgrade, wrote one warning per connection:
    any client without a key could fill the log at the default level."""
    import logging

    from tandem.serve.connections import CLIENT_MISTAKES_SAID_EVERY_S, ClientMistakesSaidOnce

    clock = [0.0]
    said_once = ClientMistakesSaidOnce(clock=lambda: clock[0])

    def record(msg):
        return logging.LogRecord("uvicorn.error", logging.WARNING, "h11_impl.py", 1, msg, (), None)

    passed = [r.getMessage() for r in (record("Invalid HTTP request received.") for _ in range(50))
              if said_once.filter(r)]
    assert passed == ["Invalid HTTP request received. (a client's; said at most once a minute)"]
    assert said_once.filter(record("Unsupported upgrade request."))  # another kind: said at once
    assert said_once.filter(record("Application startup complete."))  # not a client's: always
    clock[0] += CLIENT_MISTAKES_SAID_EVERY_S
    again = record("Invalid HTTP request received.")
    assert said_once.filter(again) and "49 more since the last such line" in again.getMessage()
