"""The browser demo's logic without a browser (`itune_hf.app`): caption + heatmaps, adapters, bad files, `itune serve`.

The page itself, in a real Chromium, is tested in `test_app_browser.py`.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

import itune_hf
from itune_hf.cli import main

PRESET = "itune-tiny-random"


def explain_available() -> bool:
    """Whether this checkout has `itune_hf.explain` (not find_spec: an editable install of another checkout would
    answer for it)."""
    return Path(itune_hf.__file__).with_name("explain.py").is_file()


def stub_explain_module() -> types.ModuleType:
    """Stands in for `itune_hf.explain` where this checkout does not have it: the contract only.

    The caption is generated for real; the heatmaps are uniform over an 8x8 grid, drawn with matplotlib.
    """
    from dataclasses import dataclass, field

    module = types.ModuleType("itune_hf.explain")

    @dataclass
    class Explanation:
        caption: str
        tokens: list
        heatmaps: np.ndarray
        cls_attention: np.ndarray
        layers: list
        heads: list
        extra: dict = field(default_factory=dict)

    def explain_caption(model, processor, image, *, num_beams=1, max_new_tokens=None, layer=None, head=None):
        ids = model.generate(**processor(images=[image]), num_beams=num_beams, max_new_tokens=max_new_tokens)
        tokens = processor.decode(ids[0], skip_special_tokens=True).split() or ["?"]
        maps = np.full((len(tokens), 8, 8), 1 / 64)
        return Explanation(" ".join(tokens), tokens, maps, np.zeros(len(tokens)), model.image_layers(), [0])

    def draw_explanation(image, explanation, *, columns=4, image_processor=None, display_edge=1024):
        from matplotlib.figure import Figure

        figure = Figure(figsize=(3 * columns, 3))
        for index, heatmap in enumerate(explanation.heatmaps[:columns]):
            axes = figure.add_subplot(1, columns, index + 1)
            axes.imshow(np.asarray(image))
            axes.imshow(heatmap, extent=(0, image.width, image.height, 0), cmap="jet", alpha=0.5)
        return figure

    module.Explanation, module.explain_caption, module.draw_explanation = Explanation, explain_caption, draw_explanation
    module.DISPLAY_EDGE = 1024
    return module


@pytest.fixture(scope="module")
def service():
    from itune_hf.app import load_service

    with pytest.MonkeyPatch.context() as patch:
        if not explain_available():
            patch.setitem(sys.modules, "itune_hf.explain", stub_explain_module())
        yield load_service(PRESET)


@pytest.fixture(scope="module")
def photo(service):
    if not service.samples:
        pytest.skip("no sample photo installed (scikit-image, scikit-learn or matplotlib)")
    return next(iter(service.samples.values()))


def test_caption_and_heatmaps_of_a_photo(service, photo):
    result = service.caption(photo, num_beams=2, max_new_tokens=6)
    assert result.caption, result.message
    assert "2 beam(s)" in result.message
    figure = np.asarray(result.figure)
    assert figure.ndim == 3 and figure.shape[0] > 100 and figure.shape[1] > 100
    assert figure.std() > 10  # a drawn figure, not a blank canvas


def test_a_file_that_is_not_an_image_gives_a_message(service, tmp_path):
    bad = tmp_path / "notes.jpg"
    bad.write_text("not a photo")
    result = service.caption(bad)
    assert (result.caption, result.figure) == ("", None)
    assert "notes.jpg" in result.message and "not an image" in result.message


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` pixels and holds no pixel data (what a decompression bomb starts with)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [6_000, 100_000])  # over the demo's limit; over the package's bomb limit too
def test_a_huge_image_gives_a_message_before_decoding(service, tmp_path, side):
    huge = tmp_path / "huge.png"
    huge.write_bytes(_png_header(side, side))
    result = service.caption(huge)
    assert (result.caption, result.figure) == ("", None)
    assert "huge.png" in result.message and "pixels" in result.message
    assert f"{side}x{side}" in result.message or "decompression bomb" in result.message


def test_out_of_range_choices_and_no_image_give_messages(service, photo):
    assert "beams must be between 1 and 5" in service.caption(photo, num_beams=6).message
    assert "max length" in service.caption(photo, max_new_tokens=10_000).message
    assert "no image given" in service.caption(None).message
    assert "unknown adapter 'nope'" in service.caption(photo, adapter="nope").message


def test_adapters_switch_on_one_base(service, tmp_path):
    import torch
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig, build_model
    from itune_hf.app import adapter_weights, module_weights

    model = service.model
    base = build_model(PRESET, add_ituning_modules=False)
    adapter = get_peft_model(base, ITuningAdapterConfig(**model.config.settings.as_dict()))
    with torch.no_grad():
        for name, parameter in adapter.named_parameters():
            if "ituning_modules" in name:
                parameter.fill_(0.5)
    adapter.save_pretrained(tmp_path / "half")
    service.adapters["half"] = adapter_weights(model, tmp_path / "half")
    try:
        own = next(iter(service.adapters))
        service.use_adapter("half")
        assert all(torch.all(tensor == 0.5) for tensor in module_weights(model).values())
        service.use_adapter(own)
        assert all(torch.equal(module_weights(model)[k], v) for k, v in service.adapters[own].items())
    finally:
        service.use_adapter(next(iter(service.adapters)))
        del service.adapters["half"]

    other = get_peft_model(build_model(PRESET, add_ituning_modules=False), ITuningAdapterConfig(num_heads=2))
    other.save_pretrained(tmp_path / "two-heads")
    with pytest.raises(ValueError, match="two-heads.*settings"):
        adapter_weights(model, tmp_path / "two-heads")
    with pytest.raises(ValueError, match="no adapter_config.json"):
        adapter_weights(model, tmp_path)


def test_itune_serve_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--adapter", "--host", "--port", "--max-beams", "--max-new-tokens"):
        assert flag in out


def test_a_caption_the_lm_has_no_positions_for_is_refused(service, photo, capsys, monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(service, "limits", replace(service.limits, max_new_tokens=500))
    result = service.caption(photo, num_beams=1, max_new_tokens=200)  # the tiny LM has 128 positions
    assert not result.caption and "at most 127 tokens" in result.message  # a message, not a traceback
    if importlib.util.find_spec("gradio") is None:
        return
    assert main(["serve", "--model", PRESET, "--max-new-tokens", "200", "--port", str(free_port())]) == 2
    assert "--max-new-tokens 200: the captioner's language model has 128 positions" in capsys.readouterr().err


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_itune_serve_refuses_a_bad_port_before_loading(capsys):
    if importlib.util.find_spec("gradio") is None:
        assert main(["serve", "--model", PRESET]) == 2
        assert "pip install 'itune-hf[app]'" in capsys.readouterr().err
        return
    assert main(["serve", "--model", PRESET, "--port", "70000"]) == 2
    assert "--port must be between 1 and 65535, got 70000" in capsys.readouterr().err


def test_itune_serve_on_a_busy_port_names_the_other_server_before_loading(capsys):
    import socket

    if importlib.util.find_spec("gradio") is None:
        pytest.skip("gradio is not installed (pip install 'itune-hf[app]')")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert main(["serve", "--model", "no/such-model", "--port", str(port)]) == 2  # refused before the model
    captured = capsys.readouterr()
    line = captured.err.strip().splitlines()[-1]
    assert f"--port {port}: another server already listens at http://127.0.0.1:{port}" in line, captured.err
    assert "open http" not in captured.out and "Traceback" not in captured.err


def test_space_requirements_follow_the_package():
    """examples/space/requirements.txt installs what itune_hf needs (setup.cfg), since the Space copies the package."""
    import configparser
    import re

    root = Path(__file__).resolve().parents[1]
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")

    def names(text: str) -> set[str]:
        lines = (line.split("#")[0].strip() for line in text.splitlines())
        return {re.split(r"[<>=!~\[ ;]", line)[0].lower() for line in lines if line and not line.startswith("-")}

    needed = names(config["options"]["install_requires"]) | names(config["options.extras_require"]["app"])
    space = (root / "examples" / "space").resolve()
    assert needed - {"gradio"} <= names((space / "requirements.txt").read_text())
    metadata = (space / "README.md").read_text().split("---")[1]
    for key in ("title:", "sdk: gradio", "sdk_version:", "app_file: app.py", "license: apache-2.0", "models:"):
        assert key in metadata
    assert "from itune_hf.app import" in (space / "app.py").read_text()


def test_the_page_starts_and_captions_without_contacting_anything_beyond_loopback(service, photo, monkeypatch):
    """No telemetry, no version check: the page needs nothing from outside (a refused connection is recorded here,
    never sent: the test process's sockets may reach loopback only)."""
    if importlib.util.find_spec("gradio") is None:
        pytest.skip("gradio is not installed (pip install 'itune-hf[app]')")
    import socket
    import threading
    import urllib.request

    from itune_hf.app import serve

    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)  # the package turns it off, not the environment
    attempts, real_connect = [], socket.socket.connect

    def loopback_only(sock, address):
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"test: connection to {address} refused")
        return real_connect(sock, address)

    real_getaddrinfo = socket.getaddrinfo

    def loopback_names_only(host, *args, **kwargs):  # a lookup of another host is an attempt too (it comes first)
        if host not in (None, "127.0.0.1", "::1", "localhost", "0.0.0.0"):
            attempts.append(host)
            raise OSError(f"test: lookup of {host} refused")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    monkeypatch.setattr(socket, "getaddrinfo", loopback_names_only)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = serve(service, host="127.0.0.1", port=port, block=False)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as response:
            assert response.status == 200
        result = service.caption(photo, num_beams=1, max_new_tokens=4)
        assert result.caption
        for thread in threading.enumerate():  # a version check runs in a thread: give it its moment
            if thread.name.startswith("Thread") and thread is not threading.current_thread() and not thread.daemon:
                thread.join(timeout=5)
    finally:
        app.close()
    assert attempts == []


def test_the_heatmaps_of_a_large_photo_are_drawn_over_a_display_copy(service, tmp_path, monkeypatch):
    from PIL import Image

    import itune_hf.explain as explain

    drawn, real_draw = [], explain.draw_explanation

    def record(image, *args, **kwargs):
        figure = real_draw(image, *args, **kwargs)
        drawn.append(figure.axes[0].images[0].get_array().shape[:2])  # the picture as drawn: (height, width)
        return figure

    monkeypatch.setattr(explain, "draw_explanation", record)
    from dataclasses import replace

    monkeypatch.setattr(service, "limits", replace(service.limits, display_edge=64))  # 1,024 by default
    path = tmp_path / "wide.png"
    Image.new("RGB", (400, 200), (200, 30, 30)).save(path)
    result = service.caption(str(path), num_beams=1, max_new_tokens=3)
    assert result.caption and drawn == [(32, 64)]  # the aspect ratio kept
