"""The dashboard in headless Chromium (Debian's chromium + chromium-driver via selenium; nothing downloaded).

Two variants: (1) the StatusServer over a NodeStats that a background thread feeds with demo steps (always runs
where Chromium is installed) and (2) a real `swarm-node solo` subprocess (skipped until `cli/main.py` has a
`solo` command). Each opens `/`, waits until the reward chart has at least two points and the peers table has
rendered, checks what the page shows against the stats, and saves a PNG to the test's tmp dir. The README's
docs/dashboard.png is written only with SWARM_NODE_UPDATE_SCREENSHOT=1 (the solo variant's picture, a real node):
tests never modify tracked files otherwise.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm_node.status.demo import DEMO_PEERS, feed
from swarm_node.status.server import StatusServer
from swarm_node.status.stats import NodeStats

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]
DOCS_PNG = REPO / "docs" / "dashboard.png"
# Tests never touch tracked files unless asked: SWARM_NODE_UPDATE_SCREENSHOT=1 refreshes the README picture.
UPDATE_DOCS = os.environ.get("SWARM_NODE_UPDATE_SCREENSHOT") == "1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WAIT_S = 40
PAGE_STATE = """
const cards = {};
document.querySelectorAll("#cards .card").forEach(c => {
  cards[c.querySelector(".k").textContent.toLowerCase()] = c.querySelector(".v").textContent; });
const rows = [...document.querySelectorAll("#peers tbody tr.peer")];
return {cards: cards, peer_ids: rows.map(r => r.cells[0].title), peer_accepted: rows.map(r => r.cells[2].textContent),
        drop_bars: document.querySelectorAll("#drops-chart rect").length,
        staleness_bars: document.querySelectorAll("#staleness-chart rect").length,
        conn: document.getElementById("conn").className};
"""

needs_chromium = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs Debian's chromium and chromium-driver")


@pytest.fixture
def browser() -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,1000", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for_chart_and_peers(driver: object, min_points: int, peer_rows: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d: object) -> bool:
        points = d.find_elements(By.CSS_SELECTOR, "#reward-chart circle.reward-point")
        return len(points) >= min_points and bool(d.find_elements(By.CSS_SELECTOR, peer_rows))

    WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(ready)


def _screenshot(driver: object, tmp_path: Path, docs: bool) -> bytes:
    # The whole page, not just the viewport: Chrome DevTools Protocol screenshot beyond the viewport.
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot",
                                  {"format": "png", "captureBeyondViewport": True, "clip": clip})
    png = base64.b64decode(shot["data"])
    assert png.startswith(PNG_MAGIC)
    (tmp_path / "dashboard.png").write_bytes(png)
    if docs:
        DOCS_PNG.parent.mkdir(exist_ok=True)
        DOCS_PNG.write_bytes(png)
    return png


@needs_chromium
def test_dashboard_renders_fed_stats(browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    steps = 120
    stats = NodeStats()
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(stats, steps, 0.02), kwargs={"stop": stop}, daemon=True)
    with StatusServer(stats, port=0) as server:
        feeder.start()
        try:
            browser.get(f"{server.url}?refresh=250")
            _wait_for_chart_and_peers(browser, 2, "#peers tbody tr.peer")
            # Let the feeder finish so the page (and the screenshot) shows a fixed, seeded run.
            feeder.join(timeout=WAIT_S)
            assert not feeder.is_alive()
            WebDriverWait(browser, WAIT_S, poll_frequency=0.2).until(
                lambda d: len(d.find_elements(By.CSS_SELECTOR, "#reward-chart circle.reward-point")) == steps
                and d.find_element(By.ID, "phase").text == "DONE")
            snapshot = stats.snapshot()
            page = browser.execute_script(PAGE_STATE)  # one read: the page re-renders every refresh
            assert page["cards"]["step"] == str(steps)
            assert page["cards"]["reward"] == f"{snapshot['reward']['recent']:.3f}"
            assert page["cards"]["groups used"] == str(snapshot["groups"]["used"])  # < 10,000: no separator
            by_id = sorted(snapshot["peers"], key=lambda p: p["peer_id"])
            assert page["peer_ids"] == sorted(DEMO_PEERS)
            assert page["peer_accepted"] == [str(p["accepted"]) for p in by_id]
            assert page["drop_bars"] == len(snapshot["dropped"])
            assert page["staleness_bars"] == max(int(k) for k in snapshot["staleness"]) + 1
            assert page["conn"] == "live"
            _screenshot(browser, tmp_path, docs=UPDATE_DOCS and not DOCS_PNG.exists())
        finally:
            stop.set()
            feeder.join(timeout=5)


def _solo_available() -> bool:
    main = REPO / "cli" / "main.py"
    return main.exists() and re.search(r"def solo\b|name=\"solo\"", main.read_text()) is not None


@needs_chromium
@pytest.mark.slow
@pytest.mark.skipif(not _solo_available(), reason="cli/main.py has no `solo` command yet")
def test_dashboard_of_a_solo_node(browser: object, tmp_path: Path) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from swarm_node.model.default_model import ensure_default_model

    # The node builds the embedded default model on first use (minutes on a fresh machine): build it here first, so
    # the browser's wait measures the dashboard, not the build.
    ensure_default_model()
    command = [sys.executable, "-c", "from cli.main import app; app()", "solo", "--steps", "6", "--sampler", "hf",
               "--status-port", "0", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        url = _read_status_url(proc, lines)
        browser.get(f"{url}?refresh=250")
        _wait_for_chart_and_peers(browser, 2, "#peers tbody tr")
        assert browser.find_elements(By.CSS_SELECTOR, "#peers tbody tr.no-peers")  # solo: no peers
        page = browser.execute_script(PAGE_STATE)
        assert page["conn"] == "live" and int(page["cards"]["step"]) >= 2
        _screenshot(browser, tmp_path, docs=UPDATE_DOCS)
        # Best effort for the README: a fuller curve, taken while the node still serves (it exits after step 6).
        try:
            WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
                lambda d: len(d.find_elements(By.CSS_SELECTOR, "#reward-chart circle.reward-point")) >= 6
                or proc.poll() is not None)
        except TimeoutException:
            return
        if browser.execute_script(PAGE_STATE)["conn"] == "live":
            _screenshot(browser, tmp_path, docs=UPDATE_DOCS)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_status_url(proc: subprocess.Popen, lines: list[str]) -> str:
    """The URL from the node's `status: http://127.0.0.1:PORT/` line (fails with the output if it never comes)."""
    result: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"status: (http://\S+/)", line)
            if match and not result:
                result.append(match.group(1))
                # keep draining so the node never blocks on a full pipe

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for _ in range(int(WAIT_S * 10)):
        if result or proc.poll() is not None:
            break
        reader.join(timeout=0.1)
    if not result:
        pytest.fail("no `status: URL` line from swarm-node solo:\n" + "".join(lines[-40:]))
    return result[0]

