"""The built site in headless Chromium, served from 127.0.0.1: pages load without console errors, the
chain diagram renders, the minisgl/SGLang tabs switch, search finds ``prepare_for_extend``. Screenshots
at laptop (1366x800) and phone (390x844) sizes go to ``$MINISGL_ARTIFACTS`` (or the test's tmp dir).

Chromium is driven through its DevTools protocol over ``--remote-debugging-pipe`` (fds 3 and 4), so no
websocket library or driver is needed."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.test_site import built, sglang_root  # noqa: F401  (session fixtures: one build for both files)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PIECE = "minisgl.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed")


class Chromium:
    def __init__(self, profile: Path):
        to_chrome, from_chrome = os.pipe(), os.pipe()

        def wire():  # the child reads commands on fd 3 and writes replies on fd 4
            a, b = os.dup(to_chrome[0]), os.dup(from_chrome[1])
            os.dup2(a, 3)
            os.dup2(b, 4)

        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-pipe",
                 f"--user-data-dir={profile}", "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen([CHROMIUM, *flags], preexec_fn=wire, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        os.close(to_chrome[0])
        os.close(from_chrome[1])
        self.w, self.r = os.fdopen(to_chrome[1], "wb"), os.fdopen(from_chrome[0], "rb")
        self.next_id, self.events, self.buf = 0, [], b""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=True)

    def _read(self) -> dict:
        while b"\0" not in self.buf:
            chunk = self.r.read1(1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, session: bool = False, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        self.w.flush()
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait(self, expression: str, timeout: float = 15) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.js(expression):
                return True
            time.sleep(0.2)
        return False

    def open(self, url: str, width: int = 1366, height: int = 800) -> None:
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=width < 600)  # fmt: skip
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        assert self.wait("document.readyState === 'complete'"), url

    def errors(self) -> list[str]:
        self.js("1")  # drain pending events
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("text", "") + str(p["exceptionDetails"].get("exception", {})))
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"{p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def shadow_has_svg(self) -> bool:
        """Material renders mermaid into a closed shadow root; DOM.getDocument(pierce) still sees it."""
        doc = self.send("DOM.getDocument", session=True, depth=-1, pierce=True)["root"]
        stack = [doc]
        while stack:
            node = stack.pop()
            if node.get("nodeName") == "svg" and node.get("_in_shadow"):
                return True
            for key in ("children", "shadowRoots"):
                for child in node.get(key, []):
                    child["_in_shadow"] = node.get("_in_shadow") or key == "shadowRoots"
                    stack.append(child)
        return False

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(built, tmp_path_factory):  # noqa: F811
    _, site_dir = built
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    chrome = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    chrome.base = f"http://127.0.0.1:{server.server_address[1]}/"
    yield chrome
    chrome.close()
    server.shutdown()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = os.environ.get("MINISGL_ARTIFACTS")
    path = Path(root) / "site-screenshots" if root else tmp_path_factory.mktemp("site-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


PAGES = {"home": "index.html", "chain": "reference/chains/latency.html", "piece": f"reference/pieces/{PIECE}.html"}


@pytest.mark.parametrize("name", list(PAGES))
def test_page_loads_clean_at_both_sizes(browser, artifacts, name):
    for label, (w, h) in {"laptop": (1366, 800), "phone": (390, 844)}.items():
        browser.open(browser.base + PAGES[name], w, h)
        assert browser.wait("!!document.querySelector('.md-content h1')")
        if name == "chain":
            assert browser.wait("!!document.querySelector('div.mermaid')"), "mermaid did not run"
            deadline = time.time() + 15
            while not browser.shadow_has_svg() and time.time() < deadline:
                time.sleep(0.3)
            assert browser.shadow_has_svg(), "no rendered svg in the diagram"
        overflow = browser.js("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name} scrolls sideways by {overflow}px at {label}"
        browser.screenshot(artifacts / f"{name}-{label}.png")
        assert browser.errors() == [], f"console errors on {name} ({label})"


def test_tabs_switch(browser):
    browser.open(browser.base + PAGES["piece"])
    labels = browser.js("[...document.querySelectorAll('.tabbed-labels label')].map(l => l.textContent.trim())")
    assert labels[:2] == ["minisgl", "SGLang 0.5.14"]
    shown = "[...document.querySelector('.tabbed-set').querySelectorAll(':scope > .tabbed-content > .tabbed-block')].map(b => b.offsetHeight > 0)"  # noqa: E501
    assert browser.js(shown) == [True, False]
    browser.js("document.querySelectorAll('.tabbed-labels label')[1].click()")
    assert browser.wait(f"JSON.stringify({shown}) === '[false,true]'")
    assert "sglang/srt/managers/schedule_batch.py" in browser.js("document.querySelector('.tabbed-set').innerText")


def test_search_finds_prepare_for_extend(browser, artifacts):
    browser.open(browser.base + "index.html?q=prepare_for_extend")
    found = browser.wait("[...document.querySelectorAll('.md-search-result__item')]"
                         ".some(i => i.textContent.includes('prepare_for_extend'))", timeout=20)  # fmt: skip
    browser.screenshot(artifacts / "search-laptop.png")
    assert found, "search found nothing for prepare_for_extend"
    assert browser.errors() == []
