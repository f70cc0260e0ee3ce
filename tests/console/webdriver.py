"""A small W3C WebDriver client over httpx, for Debian's `chromedriver` driving Debian's `chromium`.

No browser is ever downloaded: the driver and the browser are the ones `apt-get` installed
(`CHROMEDRIVER` and `CHROMIUM` name others). The protocol is a handful of JSON calls; writing them
here keeps the suite to the packages tests/sdk already pins.
"""

from __future__ import annotations

import base64
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


class WebDriverError(AssertionError):
    pass


class Driver:
    """A chromedriver process on a port it picks, stopped by `close`."""

    def __init__(self, log_path: Path):
        for path in (CHROMEDRIVER, CHROMIUM):
            if not os.access(path, os.X_OK):
                raise WebDriverError(f"{path} is missing: scripts/test-console installs chromium and chromium-driver")
        self.proc = subprocess.Popen([CHROMEDRIVER, "--port=0", f"--log-path={log_path}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        lines: "queue.Queue[str]" = queue.Queue()

        def pump() -> None:
            for raw in iter(self.proc.stdout.readline, b""):
                lines.put(raw.decode(errors="replace"))

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 30
        port = None
        while port is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise WebDriverError("chromedriver did not start")
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if m := re.search(r"started successfully on port (\d+)", line):
                port = int(m.group(1))
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def browser(self, width: int = 1280, height: int = 900) -> "Browser":
        caps = {
            "browserName": "chrome",
            # `confirm()` before a destructive form is accepted, as a person clicking OK would.
            "unhandledPromptBehavior": "accept",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                         f"--window-size={width},{height}"],
            },
        }
        r = self.http.post("/session", json={"capabilities": {"alwaysMatch": caps}})
        if r.status_code != 200:
            raise WebDriverError(f"new session: {r.status_code} {r.text}")
        return Browser(self.http, r.json()["value"]["sessionId"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Element:
    def __init__(self, browser: "Browser", element_id: str):
        self.browser, self.id = browser, element_id

    def click(self) -> None:
        self.browser.call("POST", f"/element/{self.id}/click", {})

    def type(self, text: str) -> None:
        self.browser.call("POST", f"/element/{self.id}/clear", {})
        self.browser.call("POST", f"/element/{self.id}/value", {"text": text})

    @property
    def text(self) -> str:
        return self.browser.call("GET", f"/element/{self.id}/text")

    def attribute(self, name: str) -> str | None:
        return self.browser.call("GET", f"/element/{self.id}/attribute/{name}")

    def select(self, value: str) -> None:
        self.browser.find(f'#{self.attribute("id")} option[value="{value}"]').click()


class Browser:
    def __init__(self, http: httpx.Client, session_id: str):
        self.http, self.session = http, session_id

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, f"/session/{self.session}{path}", json=body)
        value = r.json().get("value")
        if r.status_code != 200:
            raise WebDriverError(f"{method} {path}: {r.status_code} {value}")
        return value

    def go(self, url: str) -> None:
        self.call("POST", "/url", {"url": url})

    @property
    def url(self) -> str:
        return self.call("GET", "/url")

    def find(self, css: str) -> Element:
        return Element(self, self.call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT])

    def find_all(self, css: str) -> list[Element]:
        return [Element(self, e[ELEMENT]) for e in self.call("POST", "/elements", {"using": "css selector", "value": css})]

    def text(self, css: str) -> str:
        return self.find(css).text

    def script(self, source: str, *args: Any) -> Any:
        return self.call("POST", "/execute/sync", {"script": source, "args": list(args)})

    def cookies(self) -> list[dict]:
        return self.call("GET", "/cookie")

    def resize(self, width: int, height: int) -> None:
        self.call("POST", "/window/rect", {"width": width, "height": height})

    def screenshot(self, path: Path, width: int = 1280) -> None:
        """The whole page at `width`: the window is grown to the page's height first."""
        self.resize(width, 900)
        height = int(self.script("return document.documentElement.scrollHeight"))
        height = min(max(height, 600), 8000)
        self.resize(width, height)
        # The window's height includes what the browser draws around the page: grow by the difference.
        inner = int(self.script("return window.innerHeight"))
        if inner < height:
            self.resize(width, height + (height - inner))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("GET", "/screenshot")))
        self.resize(width, 900)

    def quit(self) -> None:
        try:
            self.call("DELETE", "")
        except (WebDriverError, httpx.HTTPError):
            pass
