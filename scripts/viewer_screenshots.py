"""Open the viewer in headless Chromium, time the page's opening to its first image and to the
full-resolution image with no user action, then move its camera as a user does (a mouse drag on the
page), time the move to the first image and to the full-resolution image, and screenshot the page
in RGB and in depth.

    python scripts/viewer_screenshots.py ckpt_path=CKPT [scene=NAME ...] --out DIR [--chromium PATH]

Writes DIR/viewer_first.png (the first image, no drag), DIR/viewer_open.png (the opening camera's
full-resolution image), DIR/viewer_rgb.png and DIR/viewer_depth.png (after the move) and
DIR/viewer_timings.json. The browser is driven over the DevTools protocol (a
websocket; `websockets` comes with viser), so nothing beyond Chromium from the OS packages is
needed; `tests/test_viewer.py` uses the same `HeadlessChromium`.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from pola_gnt.core.errors import UserError, exit_on_user_error

CHROMIUM = "/usr/bin/chromium"


class HeadlessChromium:
    """A headless Chromium page driven over the DevTools protocol: open a URL, drag the mouse, screenshot.

    WebGL (viser draws with three.js) runs on SwiftShader, Chromium's software renderer."""

    def __init__(self, binary: str = CHROMIUM, width: int = 1200, height: int = 800, timeout: float = 60.0):
        if shutil.which(binary) is None:
            raise UserError(f"--chromium {binary}: no such program (apt-get install chromium)")
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.width, self.height = width, height
        self.process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",
                "--no-first-run",
                "--use-angle=swiftshader",
                "--enable-unsafe-swiftshader",
                f"--window-size={width},{height}",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",  # Chromium picks a port and writes it to DevToolsActivePort
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        wait_until(
            lambda: port_file.exists() and port_file.read_text().strip() != "", timeout, "DevTools port from Chromium"
        )
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as response:
            page = next(target for target in json.load(response) if target["type"] == "page")
        self.socket = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result (events that arrive meanwhile are dropped)."""
        request = next(self.ids)
        self.socket.send(json.dumps({"id": request, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=120))
            if message.get("id") == request:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str) -> None:
        # The page's viewport exactly width x height (the window also holds the browser's own bars).
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def drag(self, start: tuple[int, int], end: tuple[int, int], steps: int = 10) -> None:
        """A left-button drag from `start` to `end` (page pixels), as a user's mouse makes it."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=start[0], y=start[1])
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=start[0], y=start[1], button="left", clickCount=1)
        for step in range(1, steps + 1):
            x = start[0] + (end[0] - start[0]) * step / steps
            y = start[1] + (end[1] - start[1]) * step / steps
            self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y, button="left", buttons=1)
            time.sleep(0.02)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=end[0], y=end[1], button="left", clickCount=1)

    def cpu_seconds(self) -> float:
        """CPU time used so far by Chromium and its child processes (Linux /proc; 0 elsewhere)."""
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        parents: dict[int, int] = {}
        times: dict[int, float] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(stat.parent.name)
            parents[pid], times[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        tree, grown = {self.process.pid}, True
        while grown:
            children = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= children
            grown = bool(children)
        return sum(times.get(pid, 0.0) for pid in tree)

    def screenshot_png(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def screenshot(self, path: Path) -> None:
        path.write_bytes(self.screenshot_png())

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def shows_an_image(png: bytes) -> bool:
    """Whether a screenshot of the page shows a rendered image: the page's own background, left of
    the control panel and below viser's notices, is flat grey until then."""
    import imageio.v3 as iio
    import numpy as np

    pixels = np.asarray(iio.imread(png), dtype=np.float32)
    height, width = pixels.shape[:2]
    return float(pixels[height // 4 : 3 * height // 4, width // 20 : width // 2, :3].std()) > 10.0


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > timeout:
            raise UserError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.05)


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("overrides", nargs="+", help="the viewer's overrides: ckpt_path=CKPT [scene=NAME ...]")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each image")
    args = parser.parse_args()

    from pola_gnt.core.process import prepare_process

    prepare_process()
    from pola_gnt.apps.viewer import start_viewer
    from pola_gnt.runs.config.app import compose_config
    from pola_gnt.runs.config.read import read_run_settings
    from pola_gnt.runs.config.stored import trained_run_config

    overrides = [*args.overrides, "view.port=0"]
    cfg = compose_config(*overrides)
    ckpt_path = str(read_run_settings(cfg).ckpt_path)
    timings: dict[str, Any] = {}
    with HeadlessChromium(args.chromium) as browser:  # first: a missing Chromium fails before the model loads
        args.out.mkdir(parents=True, exist_ok=True)
        app = start_viewer(trained_run_config(cfg, args.out, overrides), args.out, ckpt_path)
        timings["url"] = app.url
        try:
            opened = time.perf_counter()
            browser.open(app.url)
            wait_until(lambda: bool(app.clients), args.timeout, "page connected")
            view = next(iter(app.clients.values()))
            # No drag, no click: the viewer renders the opening camera by itself.
            wait_until(lambda: view.images_shown > 0, args.timeout, "first image without a camera move")
            timings["page_open_to_first_image_s"] = round(time.perf_counter() - opened, 2)  # sent to the page
            timings["connect_to_first_image_s"] = round(view.first_image_s or 0.0, 2)  # the server's count
            # Until the page shows it: the browser paints in software here, on the renderer's cores.
            first = b""

            def painted() -> bool:
                nonlocal first
                first = browser.screenshot_png()
                return shows_an_image(first)

            wait_until(painted, args.timeout, "first image on the page")
            timings["page_open_to_first_image_shown_s"] = round(time.perf_counter() - opened, 2)
            (args.out / "viewer_first.png").write_bytes(first)
            wait_until(lambda: view.last_shown == (view.generation, "full"), args.timeout, "first full-size image")
            # When the server sent it (the screenshots above may have taken longer than the render).
            timings["page_open_to_full_s"] = round(view.moved_at + view.timings["full"] - opened, 2)
            timings["open_progress"] = view.progress.content
            timings["renders_started_before_drag"] = view.generation  # 1: the opening camera, never restarted
            time.sleep(2.0)  # the browser paints the image it was sent
            browser.screenshot(args.out / "viewer_open.png")  # the first training camera's view
            # A user's drag on the page orbits the camera: the move that is timed.
            browser_cpu = browser.cpu_seconds()
            browser.drag((600, 400), (615, 400))  # a small turn: forward-facing scenes have no back side
            released = time.perf_counter()
            # The images of the camera where the drag ended (earlier ones are cancelled or replaced).
            wait_until(
                lambda: view.last_shown is not None and view.last_shown[0] == view.generation,
                args.timeout,
                "preview after the move",
            )
            timings["release_to_preview_s"] = round(time.perf_counter() - released, 2)
            timings["preview_status"] = view.status.content
            wait_until(lambda: view.last_shown == (view.generation, "full"), args.timeout, "full image after the move")
            timings["release_to_full_s"] = round(time.perf_counter() - released, 2)
            timings["server_timings_s"] = {level: round(seconds, 2) for level, seconds in view.timings.items()}
            timings["full_status"], timings["errors"] = view.status.content, view.errors
            timings["full_progress"] = view.progress.content
            # Chromium draws WebGL in software here (SwiftShader) on the same cores as the renderer.
            timings["browser_cpu_s_during_move"] = round(browser.cpu_seconds() - browser_cpu, 1)
            time.sleep(2.0)  # the browser paints the image it was sent
            browser.screenshot(args.out / "viewer_rgb.png")
            view.mode.value = "Depth"
            time.sleep(3.0)
            browser.screenshot(args.out / "viewer_depth.png")
        finally:
            app.stop()
    (args.out / "viewer_timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    print(json.dumps(timings, indent=1))


if __name__ == "__main__":
    sys.exit(main())
