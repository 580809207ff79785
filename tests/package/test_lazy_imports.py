"""A lazy package: `import itune_hf`, `itune_hf.metrics`, `itune score` and every `--help` import neither torch,
transformers nor PEFT, while `import itune_hf` still registers the I-Tuning classes with transformers and PEFT,
whichever is imported first. Every check runs in a fresh interpreter, as a user's program would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from itune_hf.metrics.synthetic import make_corpus

from conftest import random_batch, tiny_model, write_photo

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

HEAVY = ("torch", "transformers", "peft")
REPORT_HEAVY = f"import json, sys; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
# the user's own imports of transformers and PEFT, before or after `import itune_hf`
ORDERS = {"itune_hf first": (True, False), "itune_hf last": (False, True)}


def python(script: str, timeout: int = 300) -> str:
    """Run `script` in a fresh interpreter; its stdout (the test fails with its stderr if it fails)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def heavy_modules_after(script: str) -> list[str]:
    """The heavy libraries in `sys.modules` once `script` has run in a fresh interpreter."""
    return json.loads(python(textwrap.dedent(script) + "\n" + REPORT_HEAVY).strip().splitlines()[-1])


def with_imports(body: str, order: str, user_imports: str) -> str:
    """`import itune_hf` then the user's imports and call, or the user's imports first (`order`)."""
    first, last = ORDERS[order]
    lines = ["import itune_hf"] * first + [user_imports] + ["import itune_hf"] * last
    return "\n".join([*lines, textwrap.dedent(body)])


def test_import_itune_hf_and_its_metrics_import_no_heavy_library():
    assert heavy_modules_after("import itune_hf") == []
    assert heavy_modules_after("import itune_hf.metrics") == []
    assert heavy_modules_after("from itune_hf.metrics import score_captions, tokenize_captions") == []


def test_itune_score_end_to_end_imports_no_heavy_library(tmp_path):
    predictions, references = make_corpus(20, 5, seed=3)
    pred_path, ref_path = tmp_path / "predictions.json", tmp_path / "references.json"
    pred_path.write_text(json.dumps([{"image_id": k, "caption": c} for k, c in predictions.items()]))
    annotations = [
        {"image_id": k, "id": 10 * k + i, "caption": c} for k, refs in references.items() for i, c in enumerate(refs)
    ]
    ref_path.write_text(json.dumps({"images": [{"id": k} for k in references], "annotations": annotations}))
    heavy = heavy_modules_after(f"""
        from itune_hf.cli import main
        argv = ["score", {str(pred_path)!r}, {str(ref_path)!r}, "--metrics", "BLEU,ROUGE_L,CIDEr"]
        assert main(argv + ["--per-image", {str(tmp_path / "per_image.json")!r}]) == 0
    """)
    assert heavy == []
    assert (tmp_path / "per_image.json").is_file()


def test_parser_and_every_help_import_no_heavy_library():
    heavy = heavy_modules_after("""
        import contextlib, io
        from itune_hf.cli import COMMANDS, build_parser, main
        build_parser()
        for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS]:
            with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
                main(argv)
            assert "usage: itune" in out.getvalue(), argv
    """)
    assert heavy == []


def test_every_public_name_still_imports_from_the_package():
    out = python("""
        import itune_hf
        listed = set(itune_hf.__all__)
        assert listed <= set(dir(itune_hf)), listed - set(dir(itune_hf))
        namespace = {}
        exec("from itune_hf import *", namespace)
        assert listed <= set(namespace), listed - set(namespace)
        assert itune_hf.hub.save_captioner and itune_hf.register_auto_classes  # submodules, former attributes
        print(sorted(listed))
    """)
    assert "ITuningForCaptioning" in out and "build_model" in out


# ------------------------------------------------------------------------------------------------------------------
# The contract of `import itune_hf`: (a) PEFT adapters, (b) Auto classes, (c) the image-to-text pipeline.
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def peft_dirs(tmp_path_factory):
    """A bare base captioner, an I-Tuning adapter for it, and the logits the adapted model gives on a batch."""
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig

    root = tmp_path_factory.mktemp("peft")
    base = tiny_model(add_ituning_modules=False)
    base.save_pretrained(root / "base")
    model = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    model.save_pretrained(root / "adapter")
    pixel_values, captions = random_batch()
    with torch.no_grad():
        logits = model(pixel_values=pixel_values, labels=captions).logits
    torch.save({"pixel_values": pixel_values, "captions": captions, "logits": logits}, root / "io.pt")
    return root


@pytest.mark.parametrize("order", ORDERS)
def test_a_peft_model_from_pretrained_loads_an_ituning_adapter(peft_dirs, order):
    script = with_imports(
        f"""
        base = AutoModelForImageTextToText.from_pretrained({str(peft_dirs / "base")!r})
        model = PeftModel.from_pretrained(base, {str(peft_dirs / "adapter")!r}).eval()
        io = torch.load({str(peft_dirs / "io.pt")!r})
        with torch.no_grad():
            logits = model(pixel_values=io["pixel_values"], labels=io["captions"]).logits
        assert torch.equal(logits, io["logits"]), (logits - io["logits"]).abs().max()
        print(model.peft_config["default"].peft_type.value, type(model.base_model).__module__)
        """,
        order,
        "import torch\nfrom peft import PeftModel\nfrom transformers import AutoModelForImageTextToText",
    )
    assert python(script).split() == ["ITUNING", "itune_hf.adapter.model"]


@pytest.mark.parametrize("order", ORDERS)
def test_b_auto_classes_resolve_the_ituning_classes(captioner_dirs, order):
    script = with_imports(
        f"""
        path = {str(captioner_dirs["full"])!r}
        for auto in (AutoConfig, AutoProcessor, AutoModelForImageTextToText):
            print(type(auto.from_pretrained(path)).__name__)
        """,
        order,
        "from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor",
    )
    assert python(script).split() == ["ITuningConfig", "ITuningProcessor", "ITuningForCaptioning"]


@pytest.mark.parametrize("order", ORDERS)
def test_c_image_to_text_pipeline_captions(captioner_dirs, order, tmp_path):
    photo = write_photo(tmp_path / "photo.png")
    script = with_imports(
        f"""
        captioner = pipeline("image-to-text", model={str(captioner_dirs["full"])!r})
        result = captioner({str(photo)!r}, num_beams=2, max_new_tokens=4)
        assert isinstance(result, list) and isinstance(result[0]["generated_text"], str), result
        print(type(captioner).__name__)
        """,
        order,
        "from transformers import pipeline",
    )
    assert python(script).strip().splitlines()[-1] == "ImageToTextPipeline"


def test_the_top_level_names_are_listed_once_for_import_and_once_for_type_checkers():
    import ast
    from pathlib import Path

    import itune_hf

    tree = ast.parse(Path(itune_hf.__file__).read_text(encoding="utf-8"))
    checking = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in checking.body for alias in node.names}
    exported = {**itune_hf._EXPORTS, **itune_hf._EXTRA_EXPORTS}
    assert set(itune_hf.__all__) == set(itune_hf._EXPORTS) and sorted(itune_hf.__all__) == itune_hf.__all__
    for name, module in typed.items():
        assert exported.get(name) == module.lstrip("."), f"TYPE_CHECKING imports {name} from {module}: see _EXPORTS"
    assert set(itune_hf._EXPORTS) <= set(typed), set(itune_hf._EXPORTS) - set(typed)
    assert itune_hf.hub.__name__ == "itune_hf.hub"  # submodules reachable after a bare import, as before


@pytest.mark.parametrize(
    "old, new",
    [
        ("itune_hf.vision.feature_cache", "itune_hf.vision.feature_cache"),
        ("itune_hf.models.packaged_backbones", "itune_hf.models.packaged_backbones"),
        ("itune_hf.training.checkpoints", "itune_hf.training.checkpoints"),
        ("itune_hf.training.config", "itune_hf.training.config"),
        ("itune_hf.training.pretraining", "itune_hf.training.pretraining"),
        ("itune_hf.training.averaging", "itune_hf.training.averaging"),
    ],
)
def test_an_old_module_name_is_the_moved_module_itself(old, new):
    import importlib

    moved = importlib.import_module(new)
    assert importlib.import_module(old) is moved and sys.modules[old] is moved
