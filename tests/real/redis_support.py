"""A throwaway redis-server for the real tests (the caches' own tests and the serving faults)."""

import shutil
import socket
import subprocess
import time

import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
START_TIMEOUT_SECONDS = 5.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisProcess:
    """A throwaway redis-server on a fixed port: no persistence, its files in `workdir`."""

    def __init__(self, workdir, port: int):
        self.workdir, self.port = workdir, port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert self.process.poll() is None, f"redis-server exited with {self.process.returncode}"
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {START_TIMEOUT_SECONDS} s")

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, the way a crashed server goes."""
        self.process.kill()
        self.process.wait()


def until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
