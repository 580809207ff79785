"""Several domains on one frozen base (`itune_hf.adapter.switching`): `--adapter NAME=DIR` in `itune caption`, `eval`
and `serve`."""

from __future__ import annotations

import json

import pytest
import torch

from itune_hf.adapter.switching import load_adapter_set, parse_named_adapters
from itune_hf.cli import main
from itune_hf.models.loading import load_captioner

from conftest import synthetic_world, train_tiny_adapter


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return synthetic_world(tmp_path_factory, "domains-world", num_images=40, seed=5)


@pytest.fixture(scope="module")
def domains(world, tmp_path_factory):
    """Two adapters of the tiny preset, trained differently (4 and 8 steps)."""
    root = tmp_path_factory.mktemp("domains")
    return {name: train_tiny_adapter(world, root / name, steps=steps) for name, steps in (("short", 4), ("long", 8))}


@pytest.fixture(scope="module")
def images(world):
    return sorted(world.parent.joinpath("images").glob("*.png"))[:4]


def greedy(model, processor, images) -> list[str]:
    from PIL import Image

    inputs = processor(images=[Image.open(path).convert("RGB") for path in images])
    with torch.no_grad():
        ids = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=6)
    return processor.batch_decode(ids)


def test_two_adapters_on_one_base_caption_as_each_does_alone(domains, images):
    loaded = load_adapter_set({name: str(path) for name, path in domains.items()})
    captions = {name: greedy(loaded.use(name), loaded.processor, images) for name in ("short", "long", "short")}
    assert captions["short"] != captions["long"]  # the same images, captioned differently
    for name, path in domains.items():
        alone, processor = load_captioner(path)
        assert captions[name] == greedy(alone, processor, images)
    # one base: its parameters once, plus each adapter's I-Tuning weights
    alone_sizes = {name: sum(p.numel() for p in load_captioner(path)[0].parameters()) for name, path in domains.items()}
    adapter_size = sum(p.numel() for n, p in loaded.model.named_parameters() if ".ituning_modules.short." in n)
    assert sum(p.numel() for p in loaded.model.parameters()) == alone_sizes["short"] + adapter_size


def test_short_adapter_names_load_without_a_false_missing_keys_warning(domains, images, recwarn):
    loaded = load_adapter_set({"a": str(domains["short"]), "b": str(domains["long"])})  # "b" is in "base_model..."
    assert not [w for w in recwarn if "missing adapter keys" in str(w.message)]
    for name, path in zip("ab", domains.values()):
        alone, processor = load_captioner(path)
        assert greedy(loaded.use(name), loaded.processor, images[:2]) == greedy(alone, processor, images[:2])


def test_caption_with_each_adapter_or_the_chosen_one(domains, images, capsys):
    adapters = [f"{name}={path}" for name, path in domains.items()]
    args = [str(p) for p in images[:2]] + ["--num-beams", "1", "--max-new-tokens", "6", "--no-progress"]
    assert main(["caption", *args, *[x for a in adapters for x in ("--adapter", a)], "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["path"], line["adapter"]) for line in lines] == [
        (str(path), name) for name in ("short", "long") for path in images[:2]
    ]
    loaded = load_adapter_set({name: str(path) for name, path in domains.items()})
    expected = greedy(loaded.use("long"), loaded.processor, images[:2])
    assert [line["caption"] for line in lines if line["adapter"] == "long"] == expected

    assert main(["caption", *args, "--adapter", adapters[0], "--adapter", adapters[1], "--use-adapter", "long"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows == [[str(path), "long", caption] for path, caption in zip(images[:2], expected)]


def test_adapter_options_are_checked_before_any_work(domains, images, captioner_dirs, capsys):
    short, long = (f"{name}={path}" for name, path in domains.items())
    image = str(images[0])
    for argv, message in [
        (["--model", str(domains["short"]), "--adapter", short], "--model and --adapter: pass one"),
        (["--adapter", short, "--use-adapter", "nope"], "--use-adapter nope: no such --adapter; choose one of short"),
        (["--adapter", short, "--adapter", f"short={domains['long']}"], "the name 'short' is given twice"),
        (["--adapter", short, "--int8"], "--int8, --precision and --vocabulary apply to --model"),
        (["--use-adapter", "short"], "--model is required (or --adapter NAME=DIR"),
        (["--adapter", short, "--adapter", f"other={captioner_dirs['adapter']}"], "trained on another base than"),
        (["--adapter", f"full={captioner_dirs['full']}"], "not an adapter-only I-Tuning checkpoint"),
    ]:
        assert main(["caption", image, *argv]) == 2
        assert message in capsys.readouterr().err, argv


def test_names_default_to_the_folder():
    assert parse_named_adapters(["coco=runs/a", "runs/photos/"]) == {"coco": "runs/a", "photos": "runs/photos/"}
    with pytest.raises(ValueError, match="expected NAME=DIR"):
        parse_named_adapters(["=runs/a"])


@pytest.mark.slow  # two evaluations with the pure-Python metrics
def test_eval_scores_each_adapter(domains, world, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--data", str(world), "--split", "test", "--num-beams", "1", "--max-new-tokens", "5"]
    argv += ["--metrics", "BLEU,CIDEr", "--output-dir", str(out)]
    assert main([*argv, *[x for name, p in domains.items() for x in ("--adapter", f"{name}={p}")]]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [row["adapter"] for row in rows] == ["short", "long"]
    for row in rows:
        report = json.loads((out / row["adapter"] / "metrics.json").read_text())
        assert report["adapter"] == row["adapter"] and report["model"] == str(domains[row["adapter"]])
        assert report["scores"] == {key: value for key, value in row.items() if key != "adapter"}


def test_serve_offers_named_adapters_on_one_base(domains, images):
    from itune_hf.app import load_service
    from itune_hf.commands.serve import _model_and_adapters

    class Args:
        model, adapter = None, [f"{name}={path}" for name, path in domains.items()]

    model, name, adapters = _model_and_adapters(Args)
    assert (model, name, adapters) == (str(domains["short"]), "short", {"long": str(domains["long"])})
    service = load_service(model, adapters, model_name=name)
    assert list(service.adapters) == ["short", "long"]
    service.use_adapter("long")
    loaded = load_adapter_set({key: str(path) for key, path in domains.items()})
    assert greedy(service.model, service.processor, images) == greedy(loaded.use("long"), loaded.processor, images)
