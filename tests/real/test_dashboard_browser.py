"""The dashboard in a real headless Chromium: a small FastAPI app with `dashboard_router`, served
by uvicorn in a thread, fed synthetic engine steps from a background thread while the page is
open. The page must load without console errors, its charts must grow, and the acceptance alert
banner must appear when acceptance drops below the threshold (and go when it recovers). Then the
same page over a real `tandem serve` (smollm2-135m-instruct drafting for itself on llama.cpp)
while chat requests run through the `openai` client."""

import os
import random
import tempfile
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from dashboard_page import CHART_IDS, open_dashboard
from fastapi import FastAPI

from tandem.bench.soak.samples import read_metrics
from tandem.engine.events import RoundReport, StepReport
from tandem.serve.api.errors import install_error_handlers
from tandem.serve.observability.dashboard import dashboard_router
from tandem.serve.observability.metrics import ServingMetrics

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(),
                       reason="Debian's chromium is not installed (scripts/system-deps.sh installs it as root)"),
]
# The README's screenshot: TANDEM_DASHBOARD_SCREENSHOT=docs/serve/dashboard.png pytest this file
SCREENSHOT = Path(os.environ.get("TANDEM_DASHBOARD_SCREENSHOT", Path(tempfile.gettempdir()) / "tandem-dashboard.png"))
STEP_INTERVAL_SECONDS = 0.05
HIGH_ACCEPTANCE, LOW_ACCEPTANCE = 0.92, 0.3  # per-position chance; rates ~0.8 and ~0.1 at k = 4


class SyntheticLoad:
    """Engine steps of 3 sequences, k = 4 each, on a thread; a request finishes every 5 steps."""

    def __init__(self, metrics: ServingMetrics, seed: int = 0):
        self.metrics = metrics
        self.acceptance = HIGH_ACCEPTANCE
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="synthetic-engine", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _accepted(self, k: int) -> int:
        return next((i for i in range(k) if self._random.random() >= self.acceptance), k)

    def _run(self) -> None:
        steps = 0
        while not self._stop.wait(STEP_INTERVAL_SECONDS):
            rounds = tuple(RoundReport(f"seq-{i}", "model", 4, self._accepted(4)) for i in range(3))
            draft, verify = 0.01 + 0.004 * self._random.random(), 0.02 + 0.01 * self._random.random()
            self.metrics.observe_step(StepReport(
                started_at=time.time() - draft - verify, step_seconds=draft + verify, prefill_seconds=0.0,
                draft_seconds=draft, verify_seconds=verify, running=3, waiting=steps % 4, batch_tokens=15,
                rounds=rounds))
            steps += 1
            if steps % 5 == 0:
                itl = [0.02 + 0.03 * self._random.random() for _ in range(20)]
                self.metrics.prompt_processed(40)
                self.metrics.tokens_generated(20)
                self.metrics.request_finished("stop", 0.1 + 0.2 * self._random.random(), 0.1 + sum(itl), itl)


@pytest.fixture
def dashboard_app():
    """(base URL, metrics) of a uvicorn server in a thread on a free port."""
    yield from _served_dashboard(data_key=None)


@pytest.fixture
def protected_dashboard_app():
    """The same, its data behind the key "sesame" (`tandem serve --protect-metrics`)."""
    yield from _served_dashboard(data_key="sesame")


def _served_dashboard(data_key: str | None):
    metrics = ServingMetrics("synthetic-model")
    app = FastAPI()
    install_error_handlers(app, metrics)  # a refusal answers 401, as in `tandem serve`
    app.include_router(dashboard_router(metrics, data_key))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", metrics
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_dashboard_charts_update_and_alert_fires(dashboard_app):
    base_url, metrics = dashboard_app
    with SyntheticLoad(metrics) as load, open_dashboard(base_url) as dashboard:
        dashboard.wait_for_updates(2)
        first = dashboard.wait_for_points("chart-acceptance", 0)
        assert set(dashboard.points()) == set(CHART_IDS)
        assert not dashboard.alert_visible()
        later = dashboard.wait_for_points("chart-acceptance", first + 2)  # new seconds, new points
        assert later > first
        points = dashboard.points()
        for chart_id in ("chart-tokens", "chart-k", "chart-latency", "chart-itl", "chart-utilization",
                         "chart-queue", "chart-positions"):
            assert points[chart_id] > 0, f"{chart_id} drew nothing: {points}"
        assert points["chart-positions"] == 4  # k = 4 draft positions

        load.acceptance = LOW_ACCEPTANCE
        dashboard.wait_for_alert(visible=True)
        assert "below the threshold of 30%" in dashboard.alert_text()
        assert metrics.alert_firing
        dashboard.wait_for_points("chart-acceptance", dashboard.points()["chart-acceptance"] + 2)
        dashboard.screenshot(SCREENSHOT)

        load.acceptance = HIGH_ACCEPTANCE
        dashboard.wait_for_alert(visible=False)
        dashboard.wait_for_tile("mean k (last 5 s)", "4.00")

        load.stop()  # the engine idles: its rounds' tile goes blank (it kept the last busy second's)
        dashboard.wait_for_tile("mean k (last 5 s)", "–", timeout_ms=10_000)
        assert dashboard.errors == []
    assert SCREENSHOT.stat().st_size > 10_000


def test_a_protected_dashboard_says_whether_its_key_is_missing_or_wrong(protected_dashboard_app):
    """It said "open this page as /#key=..." for a wrong key too, and pointed at the root, outside
    the path a proxy serves it under."""
    base_url, metrics = protected_dashboard_app
    with SyntheticLoad(metrics), open_dashboard(base_url) as dashboard:
        notice = dashboard.page.locator("#notice")
        notice.filter(has_text="add #key=YOUR_API_KEY to this page's address").wait_for(timeout=10_000)
        dashboard.page.goto(base_url + "/#key=wrong")  # the address changes, no reload: it was not read until one
        notice.filter(has_text="is not this server's API key").wait_for(timeout=10_000)
        dashboard.page.goto(base_url + "/#key=sesame")
        dashboard.wait_for_updates(2)
        dashboard.wait_for_points("chart-acceptance", 0)
        notice.wait_for(state="hidden", timeout=10_000)


def test_the_page_says_when_it_is_not_live_and_fits_a_phone(dashboard_app):
    """With the server gone, the tiles and charts kept their last values, undimmed, under a small
    grey "disconnected" in a corner; at 375 px the charts ran off the page's right edge."""
    base_url, metrics = dashboard_app
    with SyntheticLoad(metrics), open_dashboard(base_url) as dashboard:
        dashboard.wait_for_updates(2)
        dashboard.page.route("**/dashboard/data", lambda route: route.abort())  # the server goes away
        dashboard.page.wait_for_selector("body.stale", timeout=10_000)
        said = dashboard.page.inner_text("#notice")
        assert "does not answer" in said and "showing what it said at" in said
        dashboard.page.unroute("**/dashboard/data")  # and comes back
        dashboard.page.wait_for_selector("#notice", state="hidden", timeout=20_000)
        assert dashboard.page.evaluate("!document.body.classList.contains('stale')")
        dashboard.page.set_viewport_size({"width": 375, "height": 812})
        assert dashboard.page.evaluate("document.documentElement.scrollWidth") <= 375
        assert dashboard.page.get_attribute("#chart-tokens", "role") == "img"


def test_dashboard_shows_each_cluster_workers_state_and_placements(dashboard_app):
    """A worker out of restarts said "restarting" (untested), the router's placements were in the
    data but not drawn, and the round trip showed every digit (0.43217 ms)."""
    base_url, metrics = dashboard_app
    worker = {"role": "verify", "pid": 7, "sequences": 2, "restarts": 0, "rtt_ms": 0.43217, "routed": {}}
    metrics.observe_workers([
        {**worker, "name": "verify-0", "alive": True, "restarting": False, "routed": {"cost": 12, "prefix": 3}},
        {**worker, "name": "verify-1", "alive": False, "restarting": True, "rtt_ms": 12.3456},
        {**worker, "name": "draft-0", "role": "draft", "alive": False, "restarting": False, "restarts": 5}])
    with open_dashboard(base_url) as dashboard:
        rows = dashboard.worker_rows(3)
        assert [row[:3] for row in rows] == [["verify-0", "verify", "up"], ["verify-1", "verify", "restarting"],
                                             ["draft-0", "draft", "down"]]
        assert [row[5] for row in rows] == ["cost 12, prefix 3", "—", "—"]
        assert [row[7] for row in rows] == ["0.43 ms", "12 ms", "0.43 ms"]
        assert dashboard.errors == []


SERVE_COMMAND = [str(Path(sys.executable).parent / "tandem"), "serve", "--target", "smollm2-135m-instruct", "--draft", "smollm2-135m-instruct",
                 "--backend", "llamacpp", "--draft-backend", "llamacpp", "--k", "2", "--port", "0"]  # fixed k: drafts happen
SERVE_START_SECONDS = 240
BANNER = re.compile(r"at (http://\S+)/v1\b")
CHAT_QUESTIONS = ("Count from one to twenty in words.", "Name five animals that live in the sea.",
                  "Write a haiku about autumn.", "Explain what a compiler does in two sentences.")


@pytest.fixture
def tandem_server(tmp_path):
    """The base URL of a real `tandem serve` process on a free port; SIGTERM at the end."""
    root = Path(__file__).resolve().parents[2]
    with open(tmp_path / "serve.log", "w") as log:
        process = subprocess.Popen(SERVE_COMMAND, cwd=root, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            yield _wait_for_banner(process, tmp_path / "serve.log")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for_banner(process: subprocess.Popen, log_path: Path) -> str:
    found: list[str] = []

    def read() -> None:
        for line in process.stdout:
            match = BANNER.search(line)
            if match:
                found.append(match.group(1))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(SERVE_START_SECONDS)
    assert found, f"tandem serve printed no URL; its log:\n{log_path.read_text()[-3000:]}"
    return found[0]


def test_dashboard_follows_a_real_tandem_serve(tandem_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tandem_server}/v1", api_key="unused", timeout=120)
    with open_dashboard(tandem_server) as dashboard:
        dashboard.wait_for_updates(1)
        before = dashboard.points()
        threads = [threading.Thread(target=_chat, args=(client, question)) for question in CHAT_QUESTIONS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        tokens = dashboard.wait_for_points("chart-tokens", before["chart-tokens"])
        dashboard.wait_for_points("chart-latency", before["chart-latency"])
        assert tokens > before["chart-tokens"]
        assert dashboard.points()["chart-positions"] > 0  # the draft model proposed tokens
        data = httpx.get(f"{tandem_server}/dashboard/data").json()
        assert data["totals"]["requests"] == len(CHAT_QUESTIONS)
        assert data["totals"]["drafted"] > 0 and data["latency"]["e2e"]["count"] == len(CHAT_QUESTIONS)
        assert dashboard.errors == []
    metrics = httpx.get(f"{tandem_server}/metrics").text
    assert 'tandem:request_success_total{finished_reason="stop",model_name="smollm2-135m-instruct"}' in metrics \
        or 'tandem:request_success_total{finished_reason="length",model_name="smollm2-135m-instruct"}' in metrics
    drafting = read_metrics(metrics)["drafting_memory_bytes"]  # answers joined the suffix index and n-gram store
    assert drafting is not None and drafting > 0


def _chat(client, question: str) -> None:
    reply = client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=48, temperature=0,
                                           messages=[{"role": "user", "content": question}])
    assert reply.choices[0].message.content
