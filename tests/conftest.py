"""Shared fixtures: tiny random backbones built from configs (no downloads), seconds per test."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

# Tests never touch the network (the Hub is unreachable here and CI must not depend on it). huggingface_hub reads
# this when it is imported, so it is set before anything imports it; ITUNE_TEST_HUB=1 opts in to real checkpoints.
if not os.environ.get("ITUNE_TEST_HUB"):
    os.environ["HF_HUB_OFFLINE"] = "1"


def _threads_per_worker() -> int:
    """The CPUs shared out among pytest-xdist's workers (two workers of two threads on two cores oversubscribe them,
    and tiny models lose more to thread hand-offs than they gain); the commands the tests start inherit it through
    OMP_NUM_THREADS. ITUNE_TEST_THREADS overrides."""
    if os.environ.get("ITUNE_TEST_THREADS"):
        return int(os.environ["ITUNE_TEST_THREADS"])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


if "PYTEST_XDIST_WORKER_COUNT" in os.environ or os.environ.get("ITUNE_TEST_THREADS"):
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads_per_worker()))

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import CLIPVisionConfig, GPT2Config, LlamaConfig, ResNetConfig, SiglipVisionConfig  # noqa: E402

from itune_hf import ITuningConfig, ITuningForCaptioning  # noqa: E402

VOCAB = 100
BOS, EOS = 0, 1
IMAGE_SIZE = 32


def tiny_vision_config(kind: str = "clip", hidden: int = 32):
    common = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=8,
    )
    if kind == "clip":
        return CLIPVisionConfig(**common)
    if kind == "siglip":
        return SiglipVisionConfig(**common)
    if kind == "resnet":  # a convolutional tower: a (batch, hidden, 4, 4) feature map at 32 pixels, no hidden_size
        return ResNetConfig(embedding_size=16, hidden_sizes=[16, hidden], depths=[1, 1], layer_type="basic")
    raise ValueError(kind)


def tiny_text_config(kind: str = "gpt2", hidden: int = 32, layers: int = 4):
    if kind == "gpt2":
        return GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=128,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
    if kind == "llama":
        return LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=128,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=2,
        )
    raise ValueError(kind)


def tiny_config(text: str = "gpt2", vision: str = "clip", **kwargs) -> ITuningConfig:
    text_kwargs = {k: kwargs.pop(k) for k in ("hidden", "layers") if k in kwargs}
    return ITuningConfig(
        vision_config=tiny_vision_config(vision).to_dict(),
        text_config=tiny_text_config(text, **text_kwargs).to_dict(),
        **kwargs,
    )


def tiny_model(text: str = "gpt2", vision: str = "clip", seed: int = 0, **kwargs) -> ITuningForCaptioning:
    torch.manual_seed(seed)
    return ITuningForCaptioning(tiny_config(text, vision, **kwargs)).eval()


def synthetic_world(tmp_path_factory, name: str, *, num_images: int, seed: int, image_size: int = 32) -> Path:
    """A small generated captions world in a fresh temporary folder; returns its dataset.json."""
    from itune_hf.data import make_synthetic

    root = tmp_path_factory.mktemp(name)
    make_synthetic(root / "data", num_images=num_images, seed=seed, image_size=image_size)
    return root / "data" / "dataset.json"


def cached_world(tmp_path_factory, name: str, *, num_images: int = 24, seed: int = 4):
    """A small generated world and a float32 feature cache of the tiny random I-Tuning preset's tower over all of
    its images; returns `(splits, FeatureCache)`."""
    from datasets import concatenate_datasets

    from itune_hf.data import load_captions
    from itune_hf.presets import build_processor, build_vision_tower
    from itune_hf.vision.feature_cache import FeatureCache, cache_features

    root = tmp_path_factory.mktemp(name)
    splits = load_captions(str(synthetic_world(tmp_path_factory, f"{name}-world", num_images=num_images, seed=seed)))
    torch.manual_seed(0)
    report = cache_features(
        concatenate_datasets(list(splits.values())), root / "cache",
        vision_model=build_vision_tower("itune-tiny-random"),
        image_processor=build_processor("itune-tiny-random").image_processor, dtype="float32", progress=False,
    )  # fmt: skip
    return splits, FeatureCache(report.directory)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A small generated captions world (12 images of 32 pixels, seed 0), made once per test module; returns its
    dataset.json. A module that needs another world defines its own `world`."""
    return synthetic_world(tmp_path_factory, "world", num_images=12, seed=0)


@pytest.fixture
def fresh_accelerator_state():
    """In-process runs set Accelerate's process-wide state (precision): later tests must start from none. Modules
    that run `itune train` in-process use it for every test (`pytest.mark.usefixtures("fresh_accelerator_state")`)."""
    yield
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    GradientState._reset_state()


def train_tiny_adapter(data, output_dir, steps: int = 6):
    """A few `itune_hf.training.train` steps of the tiny random I-Tuning preset on `data`; returns `output_dir`."""
    from itune_hf.training import TrainingConfig, train

    config = TrainingConfig(
        output_dir=str(output_dir),
        data=str(data),
        preset="itune-tiny-random",
        batch_size=4,
        learning_rate=1e-2,
        max_steps=steps,
        save_every=steps,
        eval_split="none",
        report_to="none",
    )
    train(config)
    return output_dir


def random_batch(batch: int = 2, length: int = 7, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    pixel_values = torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    captions = torch.randint(3, VOCAB, (batch, length), generator=generator)
    return pixel_values, captions


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(_threads_per_worker())


# ------------------------------------------------------------------------------------------------------------------
# Saved tiny captioners with the real GPT-2 tokenizer (vocabulary 50,257), as users get them from training.
# ------------------------------------------------------------------------------------------------------------------
def tiny_processor():
    from transformers import CLIPImageProcessorPil, GPT2TokenizerFast

    from itune_hf import ITuningProcessor
    from itune_hf.models.packaged_backbones import gpt2_tokenizer_dir

    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return ITuningProcessor(image_processor, GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir()))


def tiny_gpt2_vocab_config():
    return GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=50257, n_positions=128)


@pytest.fixture(scope="session")
def backbone_dirs(tmp_path_factory):
    """A tiny CLIP vision tower and a tiny GPT-2 (real vocabulary) saved as ordinary checkpoints."""
    from transformers import AutoModel, AutoModelForCausalLM

    root = tmp_path_factory.mktemp("backbones")
    torch.manual_seed(0)
    AutoModel.from_config(tiny_vision_config()).save_pretrained(root / "vision")
    AutoModelForCausalLM.from_config(tiny_gpt2_vocab_config()).save_pretrained(root / "text")
    return root / "vision", root / "text"


@pytest.fixture(scope="session")
def captioner_dirs(tmp_path_factory, backbone_dirs):
    """`full`: a full checkpoint; `adapter`: an adapter-only checkpoint of the same I-Tuning weights."""
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig
    from itune_hf.hub import save_captioner

    root = tmp_path_factory.mktemp("captioners")
    vision, text = (str(p) for p in backbone_dirs)
    base = ITuningForCaptioning.from_vision_text_pretrained(vision, text, add_ituning_modules=False)
    torch.manual_seed(1)
    adapted = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    save_captioner(adapted, root / "adapter", processor=tiny_processor())
    full = ITuningForCaptioning.from_pretrained(root / "adapter")  # the adapter's modules, made native
    save_captioner(full, root / "full", processor=tiny_processor())
    return {"full": root / "full", "adapter": root / "adapter"}


def write_photo(path, size=(48, 40), color=(200, 30, 30), mode="RGB"):
    from PIL import Image

    image = Image.new("RGB", size, color)
    image.paste((20, 20, 200), (size[0] // 2, 0, size[0], size[1] // 2))
    image.convert(mode).save(path)
    return path


def code_blocks(markdown: str, language: str) -> list[str]:
    """The fenced code blocks of one language in a markdown text (README, model cards)."""
    import re

    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", markdown, flags=re.S)]


def run_python_snippet(code: str, replacements: dict[str, str]) -> str:
    """Execute a documentation snippet with names replaced (model ids -> local tiny checkpoints); return stdout."""
    import contextlib
    import io

    for old, new in replacements.items():
        code = code.replace(old, new)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})
    return out.getvalue()


def run_where_itune_hf_is_not_installed(checkpoint, generate_call: str, tmp_path) -> tuple[str, list]:
    """Load `checkpoint` with `trust_remote_code=True` in a fresh interpreter that cannot import itune_hf, caption
    with `generate_call` (code using `model` and `processor`), and return (the model class's module, the ids)."""
    import json
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        repo = {repo!r}
        sys.path[:] = [p for p in sys.path if p.rstrip("/") not in (repo, repo + "/tests") and p not in ("", ".")]

        class HideItune(importlib.abc.MetaPathFinder):  # the package is not installed here
            def find_spec(self, name, path=None, target=None):
                if name == "itune_hf" or name.startswith("itune_hf."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}")
                return None

        sys.meta_path.insert(0, HideItune())
        from transformers import AutoModelForImageTextToText, AutoProcessor
        model = AutoModelForImageTextToText.from_pretrained({str(checkpoint)!r}, trust_remote_code=True).eval()
        processor = AutoProcessor.from_pretrained({str(checkpoint)!r}, trust_remote_code=True)
        ids = {generate_call}
        assert not any(name.startswith("itune_hf") for name in sys.modules), "itune_hf was imported"
        print(type(model).__module__, ids.tolist())
    """)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    module, ids = result.stdout.strip().splitlines()[-1].split(" ", 1)
    return module, json.loads(ids)


def kill_once_checkpointed(command: list[str], checkpoint, timeout: float = 300, signum=None) -> tuple[int, str]:
    """Run `command` and send it `signum` (default SIGKILL: a crash mid-run) as soon as the directory `checkpoint`
    exists; returns its exit status and what it wrote to stderr."""
    import signal
    import subprocess
    import tempfile
    import time

    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.time() + timeout
        while not checkpoint.is_dir() and time.time() < deadline:
            assert process.poll() is None, f"the run to be killed ended on its own before {checkpoint.name}"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL if signum is None else signum)
        process.wait(timeout=60)
        stderr.seek(0)
        assert checkpoint.is_dir()
        return process.returncode, stderr.read()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a launch's --main_process_port)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(options, argv) -> list[str]:
    """The command `accelerate launch OPTIONS -m itune_hf.cli ARGV` without mixed precision or dynamo (CPU tests
    add ACCELERATE_USE_CPU=true to its environment)."""
    from pathlib import Path

    script = Path(sys.executable).parent / "accelerate"  # absent where accelerate is installed with --target
    command = [str(script)] if script.exists() else [sys.executable, "-m", "accelerate.commands.accelerate_cli"]
    launcher = [*command, "launch", "--mixed_precision", "no"]
    return [*launcher, "--dynamo_backend", "no", *map(str, options), "-m", "itune_hf.cli", *map(str, argv)]


@contextlib.contextmanager
def held_by_a_live_process(directory, what: str):
    """The output lock of `directory` held by a live process (doing `what`, e.g. `"itune make-shards"`); yields its
    pid."""
    import os
    import subprocess

    from itune_hf.utils.output_dirs import LOCK_NAME

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        directory.mkdir(parents=True, exist_ok=True)
        owner = {"pid": other.pid, "host": os.uname().nodename, "what": what}
        (directory / LOCK_NAME).write_text(json.dumps(owner))
        yield other.pid
    finally:
        other.kill()
        other.wait()


#: The files holding the suite's longest tests (pytest --durations on a 2-core CPU, 2026-12-06: the XGPT learning
#: run 262 s, the smaller demo 184 s, the README's XGPT commands 111 s, every module imported alone 58 s, the
#: two-node runs 51 s). In path order the XGPT run and the two-node runs came near the end, so one xdist worker ran
#: them while the other had little left: run first, these files let the run end on short tests, shared evenly.
LONGEST_FIRST = (
    "tests/training/test_xgpt_learning.py",
    "tests/commands/test_demo.py",
    "tests/package/test_readme.py",
    "tests/package/test_import_structure.py",
    "tests/training/test_distributed.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the files of `LONGEST_FIRST` first, each whole and in its own order (module fixtures are built once); the
    rest keep pytest's order."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
