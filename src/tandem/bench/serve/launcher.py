"""A benchmark server as a subprocess: started, awaited until healthy, and always stopped.

The server runs in its own session (process group), with stdout and stderr in a log file. It is
ready once its kind names a base URL (from the port, or from a line it printed) and
GET `root + health_path` answers 200; if it exits first, or takes longer than the ready timeout,
a `TandemError` quotes the end of its log. Stopping sends SIGTERM to the whole group, then SIGKILL
after a grace period. On Linux the server also gets SIGTERM if the benchmark process itself dies
(PR_SET_PDEATHSIG), so a killed benchmark leaves no server behind.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tandem.bench.serve.server_kinds import HOST, ServerKind, ServerLaunch
from tandem.errors import TandemError

READY_TIMEOUT_S = 900.0  # a first start may pull and convert models
POLL_INTERVAL_S = 0.25
STILL_STARTING_S = 30.0  # while a server starts (a first start pulls and profiles: minutes), say so this often
HEALTH_TIMEOUT_S = 2.0
STOP_GRACE_S = 15.0
LOG_TAIL_CHARS = 1500
PR_SET_PDEATHSIG = 1


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGTERM it when the parent dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """Context manager: `with ServerProcess(...) as server: server.base_url`."""

    def __init__(self, kind: ServerKind, launch: ServerLaunch, log_path: Path,
                 ready_timeout_s: float = READY_TIMEOUT_S):
        self.kind = kind
        self.launch = launch
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.port = free_port()
        self.command = kind.command(launch, self.port)
        self.base_url: str | None = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            try:
                self._process = subprocess.Popen(
                    self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            except OSError as error:  # not a program (a binary for another machine, a data file)
                raise TandemError(f"{self.kind.label} cannot start {self.command[0]}: {error}") from None

    def wait_ready(self) -> str:
        started = time.monotonic()
        deadline, next_word = started + self.ready_timeout_s, started + STILL_STARTING_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise TandemError(f"{self.kind.label} exited with code {self._process.returncode} before "
                                  f"it was ready; end of {self.log_path}:\n{self.log_tail()}")
            log = self._read_log()
            url = self.kind.base_url(self.port, log)
            if url is not None and self._healthy(url):
                self.base_url = url
                return url
            if time.monotonic() >= next_word:
                next_word += STILL_STARTING_S
                print(f"  still starting {self.kind.label} ({time.monotonic() - started:.0f} s): "
                      f"{last_line(log)}", file=sys.stderr, flush=True)
            time.sleep(POLL_INTERVAL_S)
        raise TandemError(f"{self.kind.label} was not ready after {self.ready_timeout_s:.0f} s; "
                          f"end of {self.log_path}:\n{self.log_tail()}")

    def returncode(self) -> int | None:
        """The process's exit code once it has ended (a signal's as minus its number), else None."""
        return self._process.poll() if self._process is not None else None

    def _healthy(self, base_url: str) -> bool:
        root = base_url.removesuffix("/").removesuffix("/v1")
        try:
            return httpx.get(root + self.kind.health_path, timeout=HEALTH_TIMEOUT_S).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after the grace period; idempotent."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        print(f"stopping {self.kind.label} ...", file=sys.stderr, flush=True)  # up to STOP_GRACE_S
        self._signal_group(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)  # the leader is not reaped yet, so the group id is still ours
            process.wait()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:
            pass

    def _read_log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self) -> str:
        return self._read_log()[-LOG_TAIL_CHARS:]


def last_line(log: str) -> str:
    """The log's last line with text (a progress bar's latest state: splitlines breaks at \\r too)."""
    lines = [line.strip() for line in log.splitlines()]
    return next((line for line in reversed(lines) if line), "(nothing logged yet)")[:160]
