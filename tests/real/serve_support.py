"""Starting `tandem serve` in a subprocess for the real tests: the URL it prints, its output
kept as it runs, the official `openai` client and plain HTTP against it."""

import os
import re
import subprocess
import threading
import time

import httpx
import openai
import pytest

STARTUP_SECONDS = 240


class Server:
    def __init__(self, process: subprocess.Popen, url: str, api_key: str | None):
        self.process = process
        self.url = url  # http://127.0.0.1:PORT
        self.api_key = api_key
        self.output: list[str] = []
        self.reader: threading.Thread | None = None

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0, timeout=120,
                             **kwargs)

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def start_server(command: list[str], api_key: str | None = None, env: dict | None = None) -> Server:
    """Run `command` (a `tandem serve` with --port 0) until it prints its URL and is healthy;
    `env` is added to this process's environment."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url, lines = _read_url(process)
    served = Server(process, url, api_key)
    served.output = lines
    served.reader = threading.Thread(target=_keep_reading, args=(process, served.output), daemon=True)
    served.reader.start()
    _wait_healthy(served)
    return served


def _read_url(process: subprocess.Popen) -> tuple[str, list[str]]:
    lines, deadline = [], time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            pytest.fail(f"tandem serve exited ({process.wait()}):\n{''.join(lines)}")
        lines.append(line)
        match = re.search(r"Tandem serving \S+ at (http://\S+?)/v1 — dashboard: (http://\S+)/", line)
        if match:
            assert match.group(1) == match.group(2)
            return match.group(1), lines
    process.kill()
    pytest.fail(f"no URL printed within {STARTUP_SECONDS}s:\n{''.join(lines)}")


def _keep_reading(process: subprocess.Popen, lines: list[str]) -> None:
    for line in process.stdout:
        lines.append(line)


def _wait_healthy(served: Server) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if served.health()["status"] == "ok":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail("the server never became healthy")
