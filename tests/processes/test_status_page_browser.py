"""The status page in Debian's headless Chromium against a real group: the rendered DOM names the active
node and the epoch, a failover (kill -9 of the active) shows on the next load with the dead node drawn
unreachable, an open page follows a handover live, and screenshots are PNGs of the asked size that are
not blank.

Chromium is driven over its DevTools pipe. Every request carries the admin's Basic credentials as an extra
header, as a person's browser sends them once it cached them after the login prompt (every route
of the API needs a credential; tests/processes/test_api_processes.py checks the 401s). The first test loads with
`?stream=0` (poll only: its decision list comes from the poll); the stream is the second test's.
"""

from __future__ import annotations

import base64
import html.parser
import json
import os
import select
import shutil
import struct
import subprocess
import time
import urllib.parse
import zlib
from pathlib import Path

import pytest

from pairmq.appliance.roles import Role
from pairmq.cli import api
from tests.harness.group import active_group
from tests.harness.http_api import ADMIN_PASSWORD, admin_basic, get, hand_over

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
WIDTH, HEIGHT = 1280, 900
HEADER_RGB = (0x17, 0x21, 0x2C)  # status.css header background
PAGE_RGB = (0xF4, 0xF6, 0xF8)  # status.css --bg


class Page(html.parser.HTMLParser):
    """The few things the test reads from the rendered DOM: elements by id (attributes and text)."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.by_id: dict[str, dict] = {}
        self._open: list[tuple[str, str | None]] = []
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.by_id[attrs["id"]] = {**attrs, "text": ""}
        if tag not in ("meta", "link", "br", "img", "input"):
            self._open.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for _, element_id in self._open:
            if element_id is not None:
                self.by_id[element_id]["text"] += data

    def text(self, element_id: str) -> str:
        return " ".join(self.by_id[element_id]["text"].split())


def load(browser: "DevTools", g, url: str) -> Page:
    """A fresh page of `url` once its first poll has drawn it: its DOM."""
    browser.open(url, headers=admin_basic(g.config))
    browser.wait_for("the first poll", "document.body && document.body.dataset.state === 'ready'")
    return Page(browser.js("document.documentElement.outerHTML"))


def screenshot(browser: "DevTools", path: Path) -> tuple[int, list[bytes], int]:
    """The page at WIDTH x HEIGHT as a PNG (kept at `path` for a person to look at): width, rows, bytes/pixel."""
    browser.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
    data = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    path.write_bytes(data)
    width, height, rows = png_pixels(data)
    assert (width, height) == (WIDTH, HEIGHT)
    return width, rows, len(rows[0]) // width


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit truecolour PNG, unfiltered (PNG spec §9)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prior = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prior[i]
            c = prior[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prior = line
    return width, height, rows


def colours(width: int, rows: list[bytes], bpp: int) -> set[tuple[int, int, int]]:
    return {tuple(row[i:i + 3]) for row in rows[::3] for i in range(0, width * bpp, bpp * 3)}


def test_png_check_refuses_a_blank_screenshot():
    """The check below can fail: a one-colour PNG of the right size is refused."""
    row = b"\x00" + bytes(PAGE_RGB) * 4
    raw = zlib.compress(row * 4)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    blank = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", raw) + chunk(b"IEND", b"")
    width, height, rows = png_pixels(blank)
    assert (width, height) == (4, 4) and colours(width, rows, 3) == {PAGE_RGB}
    with pytest.raises(AssertionError):
        assert_not_blank(width, rows, 3)


def assert_not_blank(width: int, rows: list[bytes], bpp: int) -> None:
    seen = colours(width, rows, bpp)
    assert len(seen) >= 40, f"only {len(seen)} distinct colours: a blank or unstyled page"
    assert HEADER_RGB in seen and PAGE_RGB in seen, "the page's header and background colours are missing"
    top_left = tuple(rows[10][10 * bpp:10 * bpp + 3])
    assert top_left == HEADER_RGB, f"the header is not drawn at the top ({top_left})"


def test_the_status_page_shows_the_active_node_and_follows_a_failover(tmp_path):
    with active_group(tmp_path / "group") as g:
        url = f"{api.base_url(g.config, M)}/"
        assert get(g.config, url).content_type.startswith("text/html")
        browser = DevTools(tmp_path)
        try:
            page = load(browser, g, url + "?stream=0")
            assert page.text("active-node") == "primary"
            epoch = int(page.text("epoch"))
            assert epoch >= 1
            assert page.text("served-by") == "monitor" and page.text("group-name") == "test"
            assert page.by_id["node-primary"]["data-activity"] == "Local Active"
            assert page.by_id["node-backup"]["data-activity"] == "Mate Active"
            assert page.by_id["node-monitor"]["data-activity"] == "Monitor"
            assert all(page.by_id[f"node-{r.value}"]["data-reachable"] == "true" for r in Role)
            assert page.text("redundancy") == "Up" and page.text("config-sync") == "In-Sync"
            assert page.text("link-state") == "up"
            assert "taking activity" not in page.text("decisions")  # the monitor's decisions: it never takes activity
            # Its vote or what it learned: which of the two depends on whether the backup's vote came first.
            assert f"epoch {epoch}" in page.text("decisions")
            assert_not_blank(*screenshot(browser, tmp_path / "before.png"))

            g.kill(P)
            g.wait_for("the backup to serve", lambda: g.probe_once()[B] == 0)

            def reloaded_naming_the_backup():
                # The monitor learns the backup's claim from its next heartbeat, a moment after clients can.
                again = load(browser, g, url + "?stream=0")
                return again if again.text("active-node") == "backup" else None

            page = g.wait_for("a new load of the monitor's page to name the backup active", reloaded_naming_the_backup,
                              timeout_s=10, every_s=0.2)
            assert int(page.text("epoch")) > epoch
            assert page.by_id["node-backup"]["data-activity"] == "Local Active"
            assert page.by_id["node-primary"]["data-reachable"] == "false"
            assert "Node unreachable: connection refused" in page.text("node-primary")
            assert page.text("banner") == "Unreachable: primary"
            assert_not_blank(*screenshot(browser, tmp_path / "after.png"))
        finally:
            browser.close()


class DevTools:
    """Headless Chromium driven over its DevTools pipe (`--remote-debugging-pipe`: fd 3 in, fd 4 out,
    JSON messages ending in NUL), to watch one page update itself without reloads."""

    def __init__(self, tmp_path: Path) -> None:
        binary = shutil.which("chromium")
        if binary is None:
            pytest.fail("chromium is not installed: run .ci/setup (it installs Debian's chromium)")
        to_browser, self._in = os.pipe()  # we write commands to _in; Chromium reads fd 3
        self._out, from_browser = os.pipe()  # Chromium writes fd 4; we read _out

        def pipes_at_3_and_4() -> None:
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-devtools'}",
             "--remote-debugging-pipe", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=pipes_at_3_and_4)
        os.close(to_browser)
        os.close(from_browser)
        self._next_id, self._buffer, self.session = 0, b"", None

    def call(self, method: str, timeout_s: float = 20.0, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._in, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    assert "error" not in answer, answer
                    return answer["result"]
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"Chromium did not answer {method} within {timeout_s} s"
            if select.select([self._out], [], [], remaining)[0]:
                chunk = os.read(self._out, 1 << 20)
                assert chunk, "Chromium closed its DevTools pipe"
                self._buffer += chunk

    def open(self, url: str, headers: dict[str, str]) -> None:
        """A new page (tab) that sends `headers` with every request, at `url`."""
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Network.enable")
        self.call("Network.setExtraHTTPHeaders", headers=headers)
        self.call("Page.navigate", url=url)

    def js(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, what: str, expression: str, timeout_s: float = 20.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if value := self.js(expression):
                return value
            time.sleep(0.1)
        raise AssertionError(f"the page did not show {what} within {timeout_s} s: {self.js('document.body.innerText')}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        os.close(self._in)
        os.close(self._out)


def test_an_open_page_follows_a_handover_live_through_its_stream_and_poll(tmp_path):
    with active_group(tmp_path / "group") as g:
        browser = DevTools(tmp_path)
        try:
            # Streaming: the backup's own decisions arrive live.
            browser.open(f"{api.base_url(g.config, B)}/", headers=admin_basic(g.config))
            browser.wait_for("the first poll", "document.body.dataset.state === 'ready'")
            browser.wait_for("the stream open", "document.getElementById('stream-state').textContent === 'live'")
            assert browser.js("document.getElementById('active-node').textContent") == "primary"
            assert "in sync with primary" in browser.js("document.getElementById('decisions').innerText")
            epoch = int(browser.js("document.getElementById('epoch').textContent"))
            items = "[...document.querySelectorAll('#decisions li')].map(li => li.innerText)"
            newest_before = browser.js(items)[0]

            assert hand_over(g.config, P)["result"] == "handed over"
            browser.wait_for("the backup active", "document.getElementById('active-node').textContent === 'backup'")
            activation = browser.wait_for("the activation in the decision list", f"""
                [...document.querySelectorAll('#decisions li[data-kind=activate]')].map(li => li.innerText)
                    .find(text => text.includes('taking activity, epoch {epoch + 1}')) || null""")
            assert activation.startswith(tuple("0123456789"))  # its time first (HH:MM:SS)
            # Newest first: the activation is above what was the newest decision before the handover.
            after = browser.js(items)
            assert after.index(activation) < after.index(newest_before), after
            assert browser.js("document.getElementById('node-primary').dataset.activity") == "Mate Active"
            assert_not_blank(*screenshot(browser, tmp_path / "live.png"))
        finally:
            browser.close()


def test_the_page_opened_from_a_url_with_credentials_fills_its_cards_and_stream(tmp_path):
    """http://admin:PASS@host:8080/ as a person types it: no header is added, Chromium sends what the URL holds,
    and the page's own requests (which may not carry credentials in their URL) still reach the API."""
    with active_group(tmp_path / "group") as g:
        admin_basic(g.config)  # writes the admin file
        address, port = g.config.node(B).address, g.config.ports.management
        url = f"http://admin:{urllib.parse.quote(ADMIN_PASSWORD, safe='')}@{address}:{port}/"
        browser = DevTools(tmp_path)
        try:
            browser.open(url, headers={})
            browser.wait_for("the first poll", "document.body && document.body.dataset.state === 'ready'")
            browser.wait_for("the stream open", "document.getElementById('stream-state').textContent === 'live'")
            page = Page(browser.js("document.documentElement.outerHTML"))
            assert page.text("active-node") == "primary" and page.text("served-by") == "backup"
            assert all(page.by_id[f"node-{r.value}"]["data-reachable"] == "true" for r in Role)
            assert page.text("redundancy") == "Up" and page.text("link-state") == "up"
            assert page.by_id["banner"].get("hidden") is not None, page.text("banner")
            assert "in sync with primary" in page.text("decisions")
            assert_not_blank(*screenshot(browser, tmp_path / "credentials.png"))
        finally:
            browser.close()
