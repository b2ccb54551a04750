"""The server a soak runs against: the one at --url, or `tandem serve` started here (its log in the
output folder) and stopped afterwards. Either way the model name comes from its /v1/models."""

import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx

from tandem.bench.serve.launcher import ServerProcess
from tandem.bench.serve.server_kinds import TANDEM_URL
from tandem.errors import TandemError


class SoakedServer:
    """`tandem serve` as a bench server kind (see bench/serve/server_kinds.py)."""

    label = "tandem-soak"
    health_path = "/health"

    def __init__(self, target: str, draft: str | None, max_running: int, extra: list[str]):
        named = ["--draft", draft] if draft else []  # none named: `tandem serve` picks by its draft backend
        self.arguments = ["--target", target, *named, "--max-running", str(max_running), *extra]

    def command(self, launch, port: int) -> list[str]:
        return [sys.executable, "-m", "tandem.cli.main", "serve", "--port", "0", *self.arguments]

    def base_url(self, port: int, log_text: str) -> str | None:
        match = TANDEM_URL.search(log_text)
        return match.group(0) if match else None


@contextmanager
def started_server(args, out: Path):
    """Yields (base_url, model, exit_note): exit_note() says how a server started here ended, where
    it did ("" while it runs, or for the one at --url)."""
    if args.url is not None:
        yield args.url, _served_model(args.url, args.api_key), lambda: ""
        return
    kind = SoakedServer(args.target, args.draft, args.concurrency, shlex.split(args.serve_args))
    print(f"starting tandem serve (log: {out / 'server.log'}; a first start pulls and profiles models: "
          f"minutes)...", file=sys.stderr, flush=True)
    with ServerProcess(kind, None, out / "server.log") as server:

        def exit_note() -> str:
            code = server.returncode()
            return "" if code is None else f"tandem serve exited with code {code} (see {out / 'server.log'})"

        yield server.base_url, _served_model(server.base_url, args.api_key), exit_note


def _served_model(base_url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(base_url.removesuffix("/") + "/models", headers=headers, timeout=10.0)
        if response.status_code == 401:
            raise TandemError(f"{base_url} wants an API key: give soak the server's key with --api-key "
                              f"({'this one was refused' if api_key else 'none was given'})")
        if response.status_code == 404 and not base_url.rstrip("/").endswith("/v1"):
            raise TandemError(f"{base_url}/models is not found: give the API's URL, with its /v1 "
                              f"({base_url.rstrip('/')}/v1)")
        if response.status_code != 200:
            raise TandemError(f"cannot read the served model from {base_url}/models: HTTP {response.status_code}")
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
        raise TandemError(f"cannot read the served model from {base_url}/models: {error}") from None
