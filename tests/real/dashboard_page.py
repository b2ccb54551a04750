"""Drive the dashboard in a real headless browser: Debian's Chromium, never a downloaded one.

`open_dashboard(base_url)` opens `{base_url}/` (any server that includes `dashboard_router`: a
test app or a real `tandem serve`) and yields a `DashboardPage` that reads what the page exposes
for tests: each chart canvas's `data-points` (points or bars drawn) and `data-updated` (redraws),
`<body data-updated>` (snapshots received), and the alert banner. Console errors and uncaught
page errors are collected in `errors`.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHART_IDS = ("chart-acceptance", "chart-tokens", "chart-k", "chart-positions", "chart-latency", "chart-itl",
             "chart-utilization", "chart-queue")
VIEWPORT = {"width": 1440, "height": 1100}
DEFAULT_TIMEOUT_MS = 20_000


class DashboardPage:
    def __init__(self, page):
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def points(self) -> dict[str, int]:
        """{chart id: points or bars drawn by its latest redraw}."""
        return self.page.eval_on_selector_all(
            "canvas", "els => Object.fromEntries(els.map(e => [e.id, Number(e.dataset.points)]))")

    def updates(self) -> int:
        return int(self.page.get_attribute("body", "data-updated"))

    def wait_for_updates(self, count: int, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.page.wait_for_function(f"Number(document.body.dataset.updated) >= {count}", timeout=timeout_ms)

    def wait_for_points(self, chart_id: str, more_than: int, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        self.page.wait_for_function(
            f"Number(document.getElementById('{chart_id}').dataset.points) > {more_than}", timeout=timeout_ms)
        return self.points()[chart_id]

    def wait_for_tile(self, label: str, value: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """Until the tile labelled `label` shows `value`."""
        self.page.wait_for_function(
            "([label, value]) => [...document.querySelectorAll('#tiles .tile')].some("
            "t => t.querySelector('.label').textContent === label && t.querySelector('.value').textContent === value)",
            arg=[label, value], timeout=timeout_ms)

    def alert_visible(self) -> bool:
        return self.page.is_visible("#alert-banner")

    def wait_for_alert(self, visible: bool = True, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.page.wait_for_selector("#alert-banner", state="visible" if visible else "hidden", timeout=timeout_ms)

    def worker_rows(self, count: int, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[list[str]]:
        """The cluster workers table's cells, row by row, once it has `count` rows."""
        self.page.wait_for_function(f"document.querySelectorAll('#worker-rows tr').length === {count}",
                                    timeout=timeout_ms)
        return self.page.eval_on_selector_all(
            "#worker-rows tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")

    def alert_text(self) -> str:
        return self.page.inner_text("#alert-banner")

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)


@contextmanager
def open_dashboard(base_url: str) -> Iterator[DashboardPage]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            dashboard = DashboardPage(browser.new_page(viewport=VIEWPORT))
            dashboard.page.goto(base_url.rstrip("/") + "/")
            yield dashboard
        finally:
            browser.close()
