"""Screenshots of the Dagster UI of a running Cutline demo, for the docs.

Start the demo (``make demo``), let it run a few minutes so there are checkpoints to plot, kill
its driver once (``kill -9``, the pid the demo prints) so that ``restore_on_failure`` launches a
restore, then::

    python docs/screenshots.py --url http://127.0.0.1:3000 --out docs

It drives the system's headless Chromium (Debian: ``apt-get install chromium``) with Playwright
(``pip install playwright==1.65.2``; no ``playwright install`` needed). Writes ``lineage.png``,
``checkpoint_history.png``, ``restore.png`` (what the latest attempt restored), ``runs.png`` and
``automation.png``, laid out at 1440x900 (the restore's table at 1800 wide).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

DOCS = Path(__file__).resolve().parent
WIDTH, HEIGHT = 1440, 900
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/google-chrome")
# The UI opens a "Join the Dagster community" dialog on localhost until this is set.
NO_NUX = "window.localStorage.setItem('communityNux', JSON.stringify('1'));"
# How far the page's inner scroll containers overflow (Dagster scrolls panes, not the document).
OVERFLOW_JS = """() => Math.max(0, ...[...document.querySelectorAll('*')]
  .filter((e) => ['auto', 'scroll'].includes(getComputedStyle(e).overflowY))
  .map((e) => e.scrollHeight - e.clientHeight))"""


@dataclass(frozen=True)
class Shot:
    """A page of the UI, the buttons to press on it and what shows that it has rendered."""

    file: str
    path: str
    ready_text: str  # shown once the page's data has loaded
    clicks: tuple[str, ...] = ()  # buttons to press, in order, after that
    ready_selector: str | None = None  # shown once the clicks have taken effect
    full_height: bool = False  # grow the viewport so the whole scrolled pane is in the PNG
    settle_ms: int = 2000  # for charts and the graph's layout
    width: int = WIDTH  # wider for a metadata table the side panel would cut off


SHOTS = (
    Shot("lineage.png", "/asset-groups", "Latest event"),
    Shot(
        "checkpoint_history.png",
        "/assets/completed_checkpoints",
        "duration_ms",
        clicks=("Plots", "Events"),  # metadata as plots, over the last materializations
        ready_selector="canvas",
        full_height=True,
    ),
    Shot("restore.png", "/assets/streaming_jobs", "restored_from", full_height=True, width=1800),
    Shot("runs.png", "/runs", "streaming_job"),
    Shot("automation.png", "/automation", "restore_on_failure"),
)


def find_chromium() -> str:
    """The Chromium binary: ``$CHROMIUM``, else a system install; exits with a hint if none."""
    for path in (os.environ.get("CHROMIUM"), *CHROMIUM, shutil.which("chromium")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    sys.exit(
        "error: Chromium not found. Install it (Debian/Ubuntu: "
        "`apt-get install -y --no-install-recommends chromium`) or set CHROMIUM=/path/to/it."
    )


def shoot(page: Page, base_url: str, shot: Shot, out: Path) -> Path:
    """Open ``shot``'s page, wait until it has rendered and save its screenshot in ``out``."""
    page.set_viewport_size({"width": shot.width, "height": HEIGHT})
    page.goto(base_url + shot.path, wait_until="domcontentloaded")
    page.get_by_text(shot.ready_text).first.wait_for()
    for name in shot.clicks:
        page.get_by_role("button", name=name).click()
    if shot.ready_selector:
        page.locator(shot.ready_selector).first.wait_for()
    page.wait_for_timeout(shot.settle_ms)
    if shot.full_height:
        overflow = int(page.evaluate(OVERFLOW_JS))
        if overflow > 0:
            page.set_viewport_size({"width": shot.width, "height": HEIGHT + min(overflow, 4000)})
            page.wait_for_timeout(1000)
    path = out / shot.file
    page.screenshot(path=path)
    return path


def take(url: str, out: Path, timeout_s: float = 60) -> None:
    """Screenshots of all of ``SHOTS`` from the Dagster UI at ``url``, into ``out``."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        sys.exit("error: Playwright is missing: pip install playwright==1.65.2")
    executable = find_chromium()
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
        context.add_init_script(NO_NUX)
        page = context.new_page()
        page.set_default_timeout(timeout_s * 1000)
        try:
            for shot in SHOTS:
                print(f"{shoot(page, url.rstrip('/'), shot, out)}  <- {url}{shot.path}")
        except Error as e:  # timeouts and navigation errors
            sys.exit(f"error: {url}{shot.path}: {e.message.splitlines()[0]} (is the demo up?)")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000", help="the Dagster UI")
    parser.add_argument("--out", type=Path, default=DOCS, help="where the PNGs go")
    args = parser.parse_args(argv)
    take(args.url, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
