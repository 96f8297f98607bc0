"""A real browser for the page tests: the distribution's headless Chromium (`make test` installs the
Debian package when it is missing; browsers that a tool downloads itself do not run here), driven
by Playwright. One browser per test session; every page opened through it records its console
errors, uncaught exceptions and network requests (anything but the page's own file is refused).

Screenshots go to the test's tmp_path; set ANATOMY_SCREENSHOTS=DIR to collect a copy of each."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    for candidate in (os.environ.get("ANATOMY_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@dataclass
class Opened:
    """A page loaded from a file, with what it did while loading and since."""

    page: object
    url: str
    load_s: float
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def foreign_requests(self) -> list[str]:
        return [url for url in self.requests if url != self.url and not url.startswith(("data:", "blob:"))]

    def shot(self, directory: Path, name: str) -> Path:
        path = Path(directory) / f"{name}.png"
        self.page.evaluate("window.scrollTo(0, 0)")  # sticky panels where a reader first sees them
        self.page.screenshot(path=str(path), full_page=True)
        collect = os.environ.get("ANATOMY_SCREENSHOTS")
        if collect:
            Path(collect).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(collect) / path.name)
        return path


class Browser:
    def __init__(self, context) -> None:
        self.context = context

    def open(self, path: Path, *, color_scheme: str = "light") -> Opened:
        page = self.context.new_page()
        page.emulate_media(color_scheme=color_scheme)
        url = Path(path).resolve().as_uri()
        opened = Opened(page, url, 0.0)
        page.on("console", lambda m: opened.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: opened.errors.append(f"uncaught: {e}"))
        page.on("request", lambda r: opened.requests.append(r.url))
        start = time.perf_counter()
        page.goto(url, wait_until="load")
        opened.load_s = time.perf_counter() - start
        return opened


@pytest.fixture(scope="module")
def browser():
    chromium = chromium_path()
    if chromium is None:
        pytest.fail("no Chromium: `make test` installs the distribution's package (apt-get install chromium), "
                    "or set ANATOMY_CHROMIUM to a Chromium binary")
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="anatomy-chromium-")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        context.route(lambda url: not url.startswith("file:"), lambda route: route.abort())
        try:
            yield Browser(context)
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)
