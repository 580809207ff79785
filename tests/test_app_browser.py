"""The demo page in a real browser: `itune serve`'s page on 127.0.0.1, driven by the system's headless Chromium.

Playwright's Python API drives Debian's `chromium` (`/usr/bin/chromium`, or `ITUNE_CHROMIUM`); nothing downloads a
browser. Without Chromium, playwright or gradio the test skips, saying which is missing. The screenshot is kept in
pytest's tmp dir and, when `ITUNE_ARTIFACTS` names a folder, copied there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ITUNE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # a headless page counts as hidden: keep its timers and animation frames running (gradio renders on them)
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]
POLL_MS = 200  # wait_for_function polls on a timer, not on animation frames (which a hidden page may not get)
STEP_MS = 60_000  # one caption in the page
ANSWERED = "beam\\(s\\)|Cannot caption|failed"  # what the message says once the page answered


def _missing() -> str | None:
    for module, extra in (("gradio", "app"), ("playwright", "test")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'itune-hf[{extra}]')"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ITUNE_CHROMIUM)"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """The page of `itune serve --model itune-tiny-random` on a free 127.0.0.1 port, served from a thread of this
    process (the model and torch are loaded once; `test_app.py` runs the command's own argument handling)."""
    from test_app import explain_available, stub_explain_module

    from itune_hf.app import Limits, load_service, serve

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
        if not explain_available():
            patch.setitem(sys.modules, "itune_hf.explain", stub_explain_module())
        service = load_service("itune-tiny-random", limits=Limits(max_beams=2, max_new_tokens=6))
        port = _free_port()
        app = serve(service, host="127.0.0.1", port=port, block=False)
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            app.close()


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        page = context.new_page()
        page.set_default_timeout(STEP_MS)
        page.goto(server, wait_until="networkidle")
        yield page
        context.close()


def _save_artifact(path: Path) -> None:
    folder = os.environ.get("ITUNE_ARTIFACTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


def _caption(page, file: Path) -> None:
    """Upload `file`, wait until gradio has it, and press Caption."""
    page.set_input_files("#upload input[type=file]", str(file))
    # uploaded: the box lists the file (stem and suffix in separate elements) and no longer says "Uploading"
    page.wait_for_function(
        f"(box => box && box.textContent.includes({file.stem!r}) && !/Uploading/.test(box.textContent))"
        "(document.querySelector('#upload'))",
        polling=POLL_MS,
    )
    page.click("#run")


def test_upload_a_photo_see_caption_and_heatmaps(page, tmp_path):
    from itune_hf.app import sample_photos

    samples = sample_photos()
    if not samples:
        pytest.skip("no sample photo installed (scikit-image, scikit-learn or matplotlib)")
    photo = next(iter(samples.values()))
    _caption(page, photo)
    page.wait_for_function(
        f"/{ANSWERED}/.test(document.querySelector('#message')?.innerText)", polling=POLL_MS
    )  # answer or error
    screenshot = tmp_path / "itune-serve-page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert "beam(s)" in page.inner_text("#message"), page.inner_text("#message")
    page.wait_for_function("document.querySelector('#heatmap img')?.naturalWidth > 100", polling=POLL_MS)
    assert page.input_value("#caption textarea")
    page.screenshot(path=str(screenshot), full_page=True)  # with the heatmaps drawn
    assert screenshot.stat().st_size > 10_000
    _save_artifact(screenshot)


def test_a_file_that_is_not_an_image_gives_a_message_in_the_page(page, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a photo")
    page.reload(wait_until="networkidle")  # an empty upload box again, once gradio's scripts are in
    _caption(page, notes)
    page.wait_for_function(f"/{ANSWERED}/.test(document.querySelector('#message')?.innerText)", polling=POLL_MS)
    assert "not an image" in page.inner_text("#message")
    assert "notes.txt" in page.inner_text("#message")
    assert page.input_value("#caption textarea") == ""
