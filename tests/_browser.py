"""A real headless browser for the docs tests: Debian's chromium driven over the Chrome DevTools Protocol on a
pipe (`--remote-debugging-pipe`: JSON messages ended by NUL, commands on the browser's fd 3, answers and events
on its fd 4), so nothing beyond chromium itself is needed (no webdriver, no websocket library).

    with Browser(width=1280) as b:
        b.open("file:///.../index.html")
        b.eval("document.title")             # a JavaScript expression's value (JSON-able)
        b.screenshot(path)                   # the whole page, PNG

`chromium()` finds the binary (None when it is not installed).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


def _above(fd: int, lowest: int) -> int:
    """`fd` moved to a descriptor number >= lowest (the old number closed)."""
    import fcntl
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, lowest)
    os.close(fd)
    return new


class Browser:
    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 60.0):
        exe = chromium()
        if exe is None:
            raise BrowserError("chromium is not installed (Debian: apt-get install chromium)")
        self.timeout, self.width, self.height = timeout, width, height
        import tempfile
        self.profile = tempfile.mkdtemp(prefix="refimpl-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child's ends above fd 9, so that putting them at 3 and 4 cannot overwrite one with the other
        to_browser_r, from_browser_w = (_above(fd, 10) for fd in (to_browser_r, from_browser_w))
        # the browser wants its pipe ends as fds 3 and 4 exactly: bash puts them there and execs it (dash takes
        # only one-digit descriptors in a redirection)
        cmd = ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}', exe,
               "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
               "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
               "--allow-file-access-from-files", f"--window-size={width},{height}",
               f"--user-data-dir={self.profile}", "about:blank"]
        self.proc = subprocess.Popen(cmd, pass_fds=(to_browser_r, from_browser_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf, self._next_id, self._events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("Browser.close")
            except (BrowserError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- the protocol

    def call(self, method: str, session: bool = False, **params):
        """Send one command and return its result (raising BrowserError on an error answer)."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._next_id:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self._events.append(m)

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.poll() is not None else ""
                raise BrowserError(f"no answer from chromium within {self.timeout:.0f} s {err}")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed its pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for i, e in enumerate(self._events):
                if e["method"] == method:
                    return self._events.pop(i)
            self._events.append(self._read())
        raise BrowserError(f"no {method} within {self.timeout:.0f} s")

    # -- what the tests use

    def open(self, url: str) -> None:
        """Load `url` and wait for its load event (images decoded, scripts run)."""
        self._events = [e for e in self._events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", session=True, url=url)
        self._wait_event("Page.loadEventFired")

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression[:80]}...: {r['exceptionDetails'].get('text')} "
                               f"{r['exceptionDetails'].get('exception', {}).get('description', '')}")
        return r["result"].get("value")

    def screenshot(self, path, full_page: bool = True, max_height: int = 16000) -> tuple[int, int]:
        """A PNG of the page (the whole page, up to max_height CSS pixels); returns its (width, height)."""
        height = self.height
        if full_page:
            height = min(int(self.eval("document.documentElement.scrollHeight")), max_height)
        shot = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=full_page,
                         clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1})
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return self.width, height
