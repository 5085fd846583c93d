"""A small headless-Chromium driver over the DevTools protocol on a pipe (no packages needed).

Chromium started with --remote-debugging-pipe reads protocol commands from its file
descriptor 3 and writes replies and events to descriptor 4, each message a JSON object
ended by a NUL byte. This driver opens one page and offers what scripts/ui_check.py
needs: navigate, wait for a condition in the page, evaluate JavaScript, click, and
capture a PNG.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any


def slowdown() -> float:
    """How much longer than on an idle machine a browser may take now: the load average per
    core, at least 1 (a page that renders in 10 s idle takes 30 s beside two busy jobs)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


class BrowserError(RuntimeError):
    """Chromium died, answered with an error, or a wait ran out."""


def _pipe_above(lowest: int) -> tuple[int, int]:
    """A pipe whose descriptors cannot collide with the 3 and 4 that Chromium is given."""
    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest))
        os.close(fd)
    return ends[0], ends[1]


class Browser:
    def __init__(self, chromium: str, profile: Path, width: int = 1440, height: int = 900) -> None:
        to_browser_r, self._to_browser = _pipe_above(10)
        self._from_browser, from_browser_w = _pipe_above(10)
        # the shell puts the pipe ends on the descriptors 3 and 4 that Chromium expects
        command = (f'exec "$0" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run '
                   f'--remote-debugging-pipe --user-data-dir={profile} --window-size={width},{height} '
                   f'about:blank 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-')
        self.proc = subprocess.Popen(["bash", "-c", command, chromium], pass_fds=(to_browser_r, from_browser_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.command("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, self.session)

    # ------------------------------------------------------------------ protocol

    def command(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
                timeout_s: float = 60.0) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s * slowdown()
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (code {self.proc.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    # ------------------------------------------------------------------ page

    def evaluate(self, expression: str) -> Any:
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            raise BrowserError(f"script failed: {result['exceptionDetails'].get('text')}: {expression[:80]}")
        return result.get("result", {}).get("value")

    def navigate(self, url: str) -> None:
        self.command("Page.navigate", {"url": url}, self.session)

    def wait_for(self, expression: str, what: str, timeout_s: float = 90.0) -> Any:
        """Poll a JavaScript expression until it is truthy (the UI renders asynchronously)."""
        deadline = time.monotonic() + timeout_s * slowdown()
        guarded = f"(() => {{ try {{ return ({expression}); }} catch (e) {{ return null; }} }})()"
        while time.monotonic() < deadline:
            value = self.evaluate(guarded)
            if value:
                return value
            time.sleep(0.5)
        raise BrowserError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def click(self, element: str, what: str) -> None:
        """A real mouse click (press and release) at the centre of the element that the
        JavaScript expression `element` finds: menus that open on pointer events need it."""
        box = self.evaluate(f"(() => {{ const e = {element}; if (!e) return null; "
                            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
                            "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        if not box:
            raise BrowserError(f"nothing to click: {what}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.command("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                      "clickCount": 1}, self.session)

    def type_text(self, text: str) -> None:
        """Type into the focused element."""
        self.command("Input.insertText", {"text": text}, self.session)

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def screenshot(self, path: Path) -> Path:
        data = self.command("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(BrowserError):
            self.command("Browser.close", timeout_s=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
