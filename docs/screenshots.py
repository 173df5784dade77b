"""Screenshots of the Dagster UI of a running Cutline demo, for the docs.

Start the demo first (``make demo``, or ``python -m orchestration.demo --port 3000``), let it run
for a few minutes so there are checkpoints to plot, then::

    python docs/screenshots.py --url http://127.0.0.1:3000 --out docs

It drives the system's headless Chromium (Debian: ``apt-get install chromium``) with Playwright
(``pip install -e '.[docs]'``); no ``playwright install`` is needed. Writes ``lineage.png``,
``checkpoint_history.png``, ``runs.png`` and ``automation.png`` at a 1440x900 viewport.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
VIEWPORT = {"width": 1440, "height": 900}
CHROMIUM_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
)


@dataclass(frozen=True)
class Shot:
    """One page of the UI: where it is, what text shows it has rendered, where it goes."""

    file: str
    path: str
    ready_text: str
    settle_ms: int = 2000  # extra time for charts and graph layout after the text shows


SHOTS = (
    Shot("lineage.png", "/asset-groups/cutline_catalog", "completed_checkpoints"),
    Shot(
        "checkpoint_history.png",
        "/assets/completed_checkpoints?view=plots",
        "duration_ms",
        settle_ms=3000,
    ),
    Shot("runs.png", "/runs", "streaming_job"),
    Shot("automation.png", "/automation", "restore_on_failure"),
)


def find_chromium() -> str:
    """The Chromium binary: ``$CHROMIUM``, else a system install; exits with a hint if none."""
    for candidate in (os.environ.get("CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    sys.exit(
        "error: Chromium not found. Install it (Debian/Ubuntu: "
        "`apt-get install -y --no-install-recommends chromium`) or set CHROMIUM=/path/to/binary."
    )


def take(url: str, out: Path, shots: tuple[Shot, ...] = SHOTS, timeout_s: float = 60) -> None:
    """Open each page of ``shots`` under ``url`` and save its screenshot in ``out``."""
    try:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("error: Playwright is missing: pip install -e '.[docs]' (or playwright==1.65.2)")
    executable = find_chromium()
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(timeout_s * 1000)
        for shot in shots:
            page.goto(url.rstrip("/") + shot.path, wait_until="domcontentloaded")
            try:  # the UI polls, so the network may never go quiet for long
                page.wait_for_load_state("networkidle", timeout=15_000)
            except PlaywrightTimeout:
                pass
            try:
                page.get_by_text(shot.ready_text).first.wait_for(state="visible")
            except PlaywrightTimeout:
                sys.exit(f"error: {shot.path}: {shot.ready_text!r} did not show in {timeout_s}s")
            page.wait_for_timeout(shot.settle_ms)
            page.screenshot(path=out / shot.file)
            print(f"{out / shot.file}  <- {shot.path}")
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
