"""A real headless Chromium, driven over the DevTools protocol: just enough to load a page, run a
line of JavaScript in it, wait for what it shows, and take a screenshot.

It needs nothing but the ``chromium`` binary (Debian's package) and the ``websockets`` package
(uvicorn's, already installed): no browser download, no driver binary, nothing from the network.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

# The plain, offline, quiet headless flags; --no-sandbox because CI runs as root.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
WIDTH, HEIGHT = 1440, 960


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


class BrowserError(AssertionError):
    """The page threw, or what was waited for did not come."""


class Chromium:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary = binary
        self.profile = profile
        self.process: subprocess.Popen[bytes] | None = None
        self.socket: ClientConnection | None = None
        self._ids = itertools.count(1)
        self.console: list[str] = []
        self.requests: list[str] = []  # every URL the page asked for

    def __enter__(self) -> Chromium:
        self.profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=(self.profile / "chromium.log").open("wb"),
        )
        try:
            self.socket = connect(self._page_socket(), max_size=None, open_timeout=20)
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Network.enable")
            self.resize(WIDTH, HEIGHT)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    # -- the protocol ---------------------------------------------------------------------

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result, noting the console lines, exceptions and
        requests the page reported meanwhile."""
        assert self.socket is not None
        call_id = next(self._ids)
        self.socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("method") == "Runtime.consoleAPICalled":
                args = message["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", "")) for a in args))
            elif message.get("method") == "Network.requestWillBeSent":
                self.requests.append(message["params"]["request"]["url"])
            elif message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.console.append(f"exception: {details.get('exception', details)}")
            if message.get("id") == call_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def _page_socket(self) -> str:
        """The page's DevTools socket: the port Chromium chose, then its page target."""
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.profile / "chromium.log").read_text(errors="replace")[-2000:]
                raise BrowserError(f"chromium did not start: {log}")
            time.sleep(0.05)
        port = port_file.read_text().split()[0]
        while True:
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium shows no page: {targets}")
            time.sleep(0.05)

    # -- what a test does -----------------------------------------------------------------

    def goto(self, url: str) -> None:
        answer = self.call("Page.navigate", url=url)
        if answer.get("errorText"):
            raise BrowserError(f"could not load {url}: {answer['errorText']}")
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        answer = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"waited {timeout_s:g} s for {expression}; console: {self.console}"
                )
            time.sleep(0.1)

    def resize(self, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """A PNG of the page (all of it, up to 4000 px tall)."""
        if full_page:
            content = self.call("Page.getLayoutMetrics")["cssContentSize"]
            self.resize(WIDTH, min(4000, max(HEIGHT, int(content["height"]))))
        try:
            data = self.call("Page.captureScreenshot", format="png")["data"]
        finally:
            if full_page:
                self.resize(WIDTH, HEIGHT)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
