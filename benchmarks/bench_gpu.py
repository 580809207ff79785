"""How close the GPU paths come to the hardware (issue 50): the I-Tuning training step at GPT-2 large against the
measured matrix-product peak, where its time goes, what each treatment removes; batch-1 greedy decoding against the
memory-bandwidth floor; both against VisionEncoderDecoder. Random weights, bf16 autocast, one device.

Parts (`--parts`, run in this order, each in a fresh process, each skipped once `--budget-s` is spent; the JSON is
rewritten after every measurement, so a run stopped at its limit keeps what it measured):

    peak     dense bf16 matrix-product TFLOP/s (8192^3) and the device's read bandwidth (a sum over 2 GiB of bf16)
    step-N   the I-Tuning step of `bench_scale.py`'s itune-features workload (PEFT adapter in all 36 layers of GPT-2
             large, cached CLIP ViT-B/16 states, 20 tokens, AdamW) at batch N, per treatment: "recorded" as
             `bench_scale.py` ran it (fp32 weights under bf16 autocast, foreach AdamW), then "+"-joined levers:
               bf16        the frozen matrices stored in bf16 (embeddings and norms stay fp32), fused AdamW
               projecting  the modules' keys/values projected and attended with SDPA instead of training's
                           regrouped products (`ITuningModule._attend_regrouped`)
               flash       SDPA's cuDNN backend off (the LM's self-attention over 20 tokens then runs FlashAttention)
               math        SDPA's fused backends off: the LM's self-attention as products and a softmax, which
                           inductor fuses (cuDNN's kernels took 29.8 of the compiled step's 149 ms on an H200)
               attention   `flash` or `math`, whichever ran the eager `bf16+<it>+aligned` step faster at this batch
                           (`flash` when neither was measured); the row's key names the choice
               aligned     the regrouped products' 197 visual tokens padded to 200 (`regrouped_token_multiple` 8)
               compiled    the model through `torch.compile` (inductor, static shapes), compile time reported
               dynamic     compiled with dynamic shapes, as `itune train --torch-compile` compiles
               cudagraphs  compiled in inductor's "reduce-overhead" mode: the compiled forward and backward replayed
                           from CUDA graphs (cudagraph trees), AdamW outside them; the row counts inductor's
                           `cudagraph_skips` (above 0: it ran without graphs, and says why on stderr)
               graphed     the whole step (forward, backward, AdamW) captured in one CUDA graph by hand; with
                           `compiled`, the capture was invalidated on an H200 (2026-11-29) and spoiled the process's
                           CUDA RNG, so that combination is in no default list
             with a torch.profiler split of one step (forward / backward / optimizer: wall time, kernel busy time,
             kernels launched, busy time per kernel kind) for `--profile-treatments`. The default treatments are
             the issue's priority (a): the recorded step, the cheap levers together, then compiled without and with
             CUDA graphs; the single-lever ablations wait for the `ablations-N` part
    decode   I-Tuning GPT-2 large with bf16 weights, batch 1, greedy: ms per new token (the time of 21 new tokens
             minus that of 1, over 20) by `generate`'s default path (dynamic cache), with a static cache, and on the
             package's fast path (`itune_hf.inference.decoding`: a static cache, the decode step compiled by
             `generate`'s own CompileConfig, CUDA graphs), which `itune caption` and the pipeline take on a GPU; the
             floor is the bytes of weights one decode step reads over the measured read bandwidth; agreement of greedy
             captions between the paths (bf16, 8 images); VisionEncoderDecoder's default path beside it; then
             XGPT Base (xgpt-base) the same way, from cached tower states
    ved      the step against VisionEncoderDecoder at GPT-2 large, batch `--ved-batch` (bench_training.py's
             variants b: VED, backbones frozen, cross-attention trained, from pixels; d: I-Tuning on cached
             features), each treatment given to both: fp32 (no autocast: the recorded ratio), bf16, and the
             step part's fastest levers, graphed and compiled
    ablations-N  the step part at batch N with `--ablations` instead: each lever alone (graphed by hand, flash,
             aligned, projecting) and the compiled step with dynamic shapes
    captions captions/s at batch 16 and 128, greedy and beam 5, I-Tuning (default and fast path), VED, and XGPT
             Base (default and fast path); `generate` compiles no beam-search step, so beam search's fast path
             compiles the model's forward itself over a static cache (`itune_hf.inference.decoding`)

    python benchmarks/bench_gpu.py --device cuda --json gpu.json
    python benchmarks/bench_gpu.py --tiny --parts peak,step-4,decode,ved,captions --ved-batch 2 --steps 1  # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import _common as common
import torch
from torch import nn

from itune_hf.inference import decoding
from itune_hf.inference.decoding import fast_generate

#: the default order: the issue's (a) the step at batch 512, (b) batch-1 decoding against the floor, (c) the rest.
#: On an H200 (2026-11-29) one compile of the batch-512 step took 105 s and an eager treatment about 10 s with its
#: profile, so peak + step-512 take about 6 minutes and the decode part starts with its compile budget left
PARTS = ("peak", "step-512", "decode", "step-64", "ved", "captions", "ablations-512")  # step-N, ablations-N: batch N
LEVERS = (
    "fp32", "bf16", "projecting", "flash", "math", "attention", "aligned", "compiled", "dynamic", "cudagraphs",
    "graphed",
)  # fmt: skip
ATTENTION = ("flash", "math")  #: what the `attention` lever chooses between
TREATMENTS = (  # the step part's default, in order; "+"-joined levers (every treatment but "recorded" has bf16)
    "recorded", "bf16", "bf16+flash+aligned", "bf16+math+aligned", "bf16+attention+aligned+compiled",
    "bf16+attention+aligned+cudagraphs",
)  # fmt: skip
#: the treatments profiled by default: before (recorded), the eager levers, after (compiled, with CUDA graphs)
PROFILED = (
    "recorded", *(f"bf16+{name}+aligned" for name in ATTENTION),
    *(t.replace("attention", name) for t in TREATMENTS if "attention" in t for name in ATTENTION), "bf16+graphed",
)  # fmt: skip
ABLATIONS = (  # the ablations part's default: each lever alone, then dynamic shapes
    "bf16+graphed", "bf16+flash", "bf16+aligned", "bf16+projecting", "bf16+flash+aligned+compiled+dynamic",
)  # fmt: skip
KERNEL_KINDS = (  # (kind, substrings of the kernel name), first match wins
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matrix", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "wgmma", "splitk")),
    ("copy/cast", ("copy", "convert", "cast", "fill")),
    ("norm/softmax/loss", ("norm", "softmax", "nll", "cross_entropy", "reduce", "logsumexp")),
    ("compiled (triton)", ("triton",)),
    ("elementwise", ("elementwise", "vectorized", "gelu", "add", "mul")),
)


class Budget:
    """Seconds left of `--budget-s`; a part or treatment that needs more than is left is skipped, named."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Report:
    """The JSON record, rewritten after every measurement."""

    def __init__(self, path: str | None, payload: dict) -> None:
        self.path, self.payload = path, payload

    def add(self, section: str, key: str, value, *, echo: bool = True) -> None:
        self.payload.setdefault(section, {})[key] = value
        common.write_json(self.path, self.payload)
        if echo:
            print(f"  {section} / {key}: {summary(value)}", flush=True)


def summary(value) -> str:
    if isinstance(value, dict):
        shown = {k: v for k, v in value.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(shown.items())[:8])
    return str(value)


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ ceilings
def matmul_peak(device: torch.device, tiny: bool) -> float:
    size = 256 if tiny else 8192
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return common.median([2 * size**3 / common.timed(lambda: a @ b, device) for _ in range(10)]) / 1e12


def read_bandwidth(device: torch.device, tiny: bool) -> float:
    """Bytes per second of a sum over a large bf16 tensor (a read-only stream, as decoding reads its weights)."""
    x = torch.ones((2**21 if tiny else 2**31) // 2, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        x.sum()
    return x.numel() * 2 / common.median([common.timed(lambda: x.sum(), device) for _ in range(10)])


# ------------------------------------------------------------------------------------------------ models
def build_on(device: torch.device, builder):
    """Build a model on `device` directly (random init on the GPU is seconds; on the CPU, a minute at GPT-2 large)."""
    try:
        with torch.device(device):
            return builder()
    except Exception:  # a builder that makes CPU tensors explicitly: build on the CPU, then move
        return builder().to(device)


def ituning_peft(tiny: bool):
    """`bench_scale.py`'s I-Tuning: the PEFT adapter on the bare base, modules in every layer."""
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig, build_model

    torch.manual_seed(0)
    base = build_model("itune-tiny-random" if tiny else "itune-gpt2-large", add_ituning_modules=False)
    return get_peft_model(base, ITuningAdapterConfig(first_layer=base.config.first_layer))


def frozen_matrices_to_bf16(model: nn.Module) -> int:
    """Store the frozen weights of the linear layers (nn.Linear, GPT-2's Conv1D) in bf16, as autocast would cast them
    for every product anyway; embeddings, norms and the trainable parameters stay fp32. Returns the count."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
            for parameter in module.parameters(recurse=False):
                if not parameter.requires_grad and parameter.dtype == torch.float32:
                    parameter.data = parameter.data.to(torch.bfloat16)
                    count += parameter.numel()
    return count


SDP_BACKENDS = ("cudnn", "flash", "mem_efficient")  #: SDPA's fused backends (`math` turns them off)


class Levers:
    """The global switches of a treatment's levers (`projecting`, `flash`, `math`, `aligned`), set for its duration."""

    def __init__(self, levers: set[str]) -> None:
        from itune_hf.models.ituning.modeling_ituning import ITuningModule

        self.levers, self.cls = levers, ITuningModule
        self.saved = (ITuningModule._regroup_pays, ITuningModule.regrouped_token_multiple)
        self.sdp = {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in SDP_BACKENDS}

    def __enter__(self):
        if "projecting" in self.levers:
            self.cls._regroup_pays = lambda *args, **kwargs: False
        if "aligned" in self.levers:
            self.cls.regrouped_token_multiple = 8
        off = ("cudnn",) if "flash" in self.levers else SDP_BACKENDS if "math" in self.levers else ()
        for name in off:
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(False)

    def __exit__(self, *exc):
        self.cls._regroup_pays, self.cls.regrouped_token_multiple = self.saved
        for name, enabled in self.sdp.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(enabled)


COMPILING = {"compiled", "dynamic", "cudagraphs"}  #: levers that compile the model


# ------------------------------------------------------------------------------------------------ one training step
class Step:
    """One training step split in phases (forward, backward, optimizer), optionally replayed from a CUDA graph."""

    def __init__(
        self, model, inputs: dict, *, fused: bool, autocast: bool, compiled: bool, device: torch.device,
        dynamic: bool = False, mode: str | None = None,
    ):  # fmt: skip
        self.inputs, self.device, self.autocast = inputs, device, autocast
        # autocast's cast cache off for compiled steps too: then a compiled step captured in a CUDA graph runs under
        # the autocast state it was compiled for (a different one recompiles, and a compile inside a capture fails)
        self.cast_cache = not compiled
        trainable = [p for p in model.parameters() if p.requires_grad]
        capturable = device.type == "cuda"
        options = {"fused": True, "capturable": capturable} if fused else {"foreach": device.type == "cuda"}
        self.optimizer = torch.optim.AdamW(trainable, lr=1e-4, **options)
        self.forward_fn = torch.compile(model, dynamic=dynamic, mode=mode) if compiled else model
        self.loss = None
        self.graph = None

    def _autocast(self, capturing: bool = False):
        if not self.autocast:
            return nullcontext()
        # a CUDA graph must not keep autocast's cast cache from its capture
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=self.cast_cache and not capturing)

    def forward(self, capturing: bool = False) -> None:
        with self._autocast(capturing):
            self.loss = self.forward_fn(**self.inputs).loss

    def backward(self) -> None:
        self.loss.backward()

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        self.forward()
        self.backward()
        self.update()

    def phases(self) -> list[tuple[str, object]]:
        if self.graph is not None:
            return [("graph replay", self.graph.replay)]
        return [("forward", self.forward), ("backward", self.backward), ("optimizer", self.update)]

    def capture(self, warmup: int = 3) -> None:
        """Capture forward, backward and AdamW in one CUDA graph (the recipe of torch's 'whole network capture')."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.forward(capturing=True)
                self.backward()
                self.update()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.forward(capturing=True)
            self.backward()
            self.optimizer.step()
        # zero_grad stays outside: the captured backward writes into the same gradient buffers at every replay


def step_inputs(model, batch: int, device: torch.device, *, pixels: bool = False) -> dict:
    config = model.config
    vision = getattr(config, "vision_config", None) or config.encoder
    vocab = (getattr(config, "text_config", None) or getattr(config, "decoder", None)).vocab_size
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, vocab, (batch, common.CAPTION_LENGTH), generator=generator).to(device)
    if pixels:
        size = vision.image_size
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator).to(device), "labels": labels}
    tokens = (vision.image_size // vision.patch_size) ** 2 + 1
    states = torch.randn(batch, tokens, vision.hidden_size, generator=generator).to(device)
    return {"encoder_outputs": states, "labels": labels}


def count_flops(step: Step) -> tuple[int, dict[str, int]]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    by_op = {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return counter.get_total_flops(), by_op


def time_step(step: Step, steps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        step()
    return [common.timed(step, step.device) for _ in range(steps)]


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, needles in KERNEL_KINDS:
        if any(needle in lowered for needle in needles):
            return kind
    return "other"


def profile_step(step: Step) -> dict:
    """One step under torch.profiler, phase by phase (the device synchronised after each): wall time, kernel busy
    time, kernels launched and busy time per kernel kind in each phase; the rest of the wall time is launch, Python
    and idle time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if step.device.type == "cuda" else [])
    walls = {}
    with profile(activities=activities) as profiler:
        for name, function in step.phases():
            with record_function(f"phase:{name}"):
                walls[name] = 1000 * common.timed(function, step.device)
    events = profiler.events()
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    ranges = {e.name[6:]: e.time_range for e in cpu if e.name.startswith("phase:")}
    kernels = [  # kernels, copies and fills on the device; not the device-side mirrors of the annotated ranges
        e
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith(("phase:", "Optimizer.", "ProfilerStep"))
    ]
    phases = {}
    for name, wall in walls.items():
        span = ranges.get(name)
        inside = [k for k in kernels if span is not None and span.start <= k.time_range.start <= span.end]
        kinds: dict[str, float] = {}
        for k in inside:
            kinds[kernel_kind(k.name)] = kinds.get(kernel_kind(k.name), 0.0) + k.time_range.elapsed_us() / 1000
        busy = sum(kinds.values())
        phases[name] = {
            "wall_ms": wall, "kernel_busy_ms": busy, "kernels": len(inside), "not_kernel_ms": wall - busy,
            "busy_ms_by_kind": dict(sorted(kinds.items(), key=lambda item: -item[1])),
        }  # fmt: skip
    top: dict[str, float] = {}
    for k in kernels:
        top[k.name[:120]] = top.get(k.name[:120], 0.0) + k.time_range.elapsed_us() / 1000
    return {"phases": phases, "top_kernels_ms": dict(sorted(top.items(), key=lambda item: -item[1])[:15])}


def prepare(levers: set[str], model, inputs: dict, device: torch.device) -> Step:
    dynamic, cudagraphs = "dynamic" in levers, "cudagraphs" in levers
    fused, autocast = "bf16" in levers, "fp32" not in levers
    compiled = "compiled" in levers or dynamic or cudagraphs
    if dynamic or cudagraphs:
        torch._dynamo.reset()  # else the graph compiled for the same model and shapes might be reused
    mode = "reduce-overhead" if cudagraphs else None
    step = Step(model, inputs, fused=fused, autocast=autocast, compiled=compiled, device=device, dynamic=dynamic,
                mode=mode)  # fmt: skip
    if "graphed" in levers:
        if device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        if "compiled" in levers:
            step()  # compile outside the capture
        step.capture()
    return step


def cudagraph_skips() -> int:
    """How often inductor has declined to run a compiled graph from CUDA graphs in this process (it says why)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def measure_treatment(treatment: str, model, inputs: dict, args, device: torch.device) -> dict:
    release()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.monotonic()
    levers = set(treatment.split("+")) - {"recorded"}
    if unknown := levers - set(LEVERS):
        raise ValueError(f"treatment {treatment!r}: unknown levers {sorted(unknown)}; choose from {LEVERS}")
    skips = cudagraph_skips()
    with Levers(levers):
        step = prepare(levers, model, inputs, device)
        first = common.timed(step, device)  # compiles, for the compiled treatments
        setup_s = time.monotonic() - started
        seconds = time_step(step, args.steps, args.warmup)
        row = {
            "ms_per_step": 1000 * common.median(seconds), "steps_ms": [round(1000 * s, 2) for s in seconds],
            "setup_and_first_step_s": setup_s, "first_step_s": first,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "cudagraph_skips": cudagraph_skips() - skips,
        }  # fmt: skip
        if args.profile and treatment in args.profile_treatments.split(","):
            try:  # the timing above stays in the record when profiling fails
                row["profile"] = profile_step(step)
            except Exception as error:
                traceback.print_exc()
                row["profile_error"] = f"{type(error).__name__}: {str(error)[:600]}"
    del step
    release()
    return row


def step_part(batch: int, treatments: list[str], args, device: torch.device, report: Report, budget: Budget) -> None:
    """Every treatment of `treatments` at one batch size, on a model of its own (the recorded treatment needs fp32
    weights)."""
    model = build_on(device, lambda: ituning_peft(args.tiny))
    model.train()
    report.add("step", "model", {"preset": "itune-tiny-random" if args.tiny else "itune-gpt2-large",
                                 "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                                 "total_parameters": sum(p.numel() for p in model.parameters())})  # fmt: skip
    inputs = step_inputs(model, batch, device)
    if "recorded" in treatments:
        run_treatment("recorded", model, inputs, batch, args, device, report, budget)
    report.add("step", "bf16_frozen_parameters", frozen_matrices_to_bf16(model))
    flops, by_op = count_flops(Step(model, inputs, fused=True, autocast=True, compiled=False, device=device))
    report.add("step", f"flops_batch_{batch}", {"flops_per_step": flops, "per_caption": flops / batch, **by_op})
    for treatment in [t for t in treatments if t != "recorded"]:
        run_treatment(resolve_attention(treatment, batch, report), model, inputs, batch, args, device, report, budget)
    del model, inputs
    torch._dynamo.reset()
    release()


def resolve_attention(treatment: str, batch: int, report: Report) -> str:
    """`treatment` with its `attention` lever replaced by the one of `ATTENTION` whose eager `bf16+<it>+aligned` step
    at `batch` was faster in this run (`flash` when neither was measured)."""
    levers = treatment.split("+")
    if "attention" not in levers:
        return treatment
    rows = report.payload.get("step", {})
    times = {name: rows.get(f"batch_{batch}:bf16+{name}+aligned", {}).get("ms_per_step") for name in ATTENTION}
    measured = {name: ms for name, ms in times.items() if ms is not None}
    chosen = min(measured, key=measured.get) if measured else ATTENTION[0]
    print(f"  step / batch_{batch}: `attention` is {chosen} (eager ms per step: {measured or 'none measured'})")
    return "+".join(chosen if lever == "attention" else lever for lever in levers)


def budget_needed(treatment: str, args) -> int:
    """Seconds of the budget a step treatment needs to start: a compile's (`--compile-s`), else 20."""
    return args.compile_s if COMPILING & set(treatment.split("+")) else 20


def run_treatment(treatment, model, inputs, batch, args, device, report: Report, budget: Budget) -> None:
    needs = budget_needed(treatment, args)
    key = f"batch_{batch}:{treatment}"
    if budget.left() < needs:
        report.add("step", key, {"skipped": f"{budget.left():.0f} s of the budget left, {needs} s needed"})
        return
    try:
        row = measure_treatment(treatment, model, inputs, args, device)
    except Exception as error:  # recorded, and the run goes on with the next treatment
        traceback.print_exc()
        row = {"error": f"{type(error).__name__}: {str(error)[:600]}"}
        torch._dynamo.reset()
        release()
    report.add("step", key, row)


# ------------------------------------------------------------------------------------------------ decoding
def ituning_native(tiny: bool):
    from itune_hf import build_model

    torch.manual_seed(0)
    return build_model("itune-tiny-random" if tiny else "itune-gpt2-large")


def xgpt_native(tiny: bool):
    """XGPT Base (random weights), or the tiny random XGPT when `tiny`.

    Args:
        tiny: Build the smoke run's tiny preset.
    """
    from itune_hf import build_model

    torch.manual_seed(0)
    return build_model("xgpt-tiny-random" if tiny else "xgpt-base")


def decode_inputs(model, batch: int, device: torch.device, seed: int = 0) -> dict:
    """Random inputs as captioning reads them: cached tower states (I-Tuning's `encoder_outputs`, XGPT's
    `vision_hidden_states`), or VED's pixels; bf16 on `device`.

    Args:
        model: The captioner.
        batch: Images.
        device: Where they go.
        seed: The random draw.
    """
    vision = model.config.vision_config if hasattr(model.config, "vision_config") else model.config.encoder
    tokens = (vision.image_size // vision.patch_size) ** 2 + 1
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(batch, tokens, vision.hidden_size, generator=generator).to(device, torch.bfloat16)
    if hasattr(model.config, "vision_config"):
        return {"vision_hidden_states" if model.config.model_type == "xgpt" else "encoder_outputs": states}
    size = vision.image_size
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator).to(device, torch.bfloat16)}


PATHS = {  # how each decoding path calls generate(), the package's fast path first
    # itune_hf.inference.decoding: a static cache; greedy steps compiled by generate (CUDA graphs), beam search's
    # forward compiled by the package (inductor, eager prefill); what `itune caption` and the pipeline take on a GPU
    "fast": lambda model, **kwargs: fast_generate(model, "fast", **kwargs),
    "default": lambda model, **kwargs: model.generate(**kwargs),  # transformers' dynamic cache, eager
    "static": lambda model, **kwargs: model.generate(**kwargs, cache_implementation="static", disable_compile=True),
}
GREEDY_PATHS = ("fast", "default", "static")  # the decode part's


def generate_seconds(model, inputs: dict, new_tokens: int, beams: int, path: str, repeats: int) -> list[float]:
    device = next(model.parameters()).device

    def call():
        with torch.inference_mode():
            return PATHS[path](model, **inputs, num_beams=beams, do_sample=False, min_new_tokens=new_tokens,
                               max_new_tokens=new_tokens)  # fmt: skip

    call()
    call()
    return [common.timed(call, device) for _ in range(repeats)]


def per_token_ms(model, inputs: dict, path: str, repeats: int) -> dict:
    one = common.median(generate_seconds(model, inputs, 1, 1, path, repeats))
    many = common.median(generate_seconds(model, inputs, 21, 1, path, repeats))
    return {"ms_per_token": 1000 * (many - one) / 20, "first_token_ms": 1000 * one, "caption_21_tokens_ms": 1000 * many}


def weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every parameter but the vision tower and the I-Tuning modules'
    key/value projections (every path projects the visual keys/values once per image, in the prefill). The floor
    leaves out the visual keys/values each step reads (at GPT-2 large, 36 x 2 x 197 x 640 bf16 values: 18 MB per image,
    1% of the weights) and the self-attention cache, so it is a little below the true floor. For XGPT, the
    decoder's embeddings, the layers that decode and the LM head: its region embedding runs once per image.

    Args:
        model: The captioner.
    """
    if model.config.model_type == "xgpt":
        core = model.model
        parts = [core.decoder, core.decoder_layers, model.lm_head]
        read = {id(p): p for part in parts for p in part.parameters()}
        if core.memory_type_embedding is not None:
            read[id(core.memory_type_embedding)] = core.memory_type_embedding
        return sum(p.numel() * p.element_size() for p in read.values())
    vision = getattr(model, "vision_model", None) or getattr(model, "encoder", None)
    skip = {id(p) for p in vision.parameters()} if vision is not None else set()
    keys = ("k_proj", "v_proj")
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters()
               if id(p) not in skip and not (".ituning" in f".{name}" and any(k in name for k in keys)))  # fmt: skip


def agreement(model, device: torch.device, path: str, images: int = 8) -> float:
    """Share of equal tokens between the default path's greedy captions and `path`'s, image by image at batch 1 and
    21 new tokens (the timed shapes: a compiled step is not compiled again)."""
    equal = 0.0
    for seed in range(1, images + 1):
        inputs = decode_inputs(model, 1, device, seed=seed)
        outputs = []
        for name in ("default", path):
            with torch.inference_mode():
                outputs.append(PATHS[name](model, **inputs, num_beams=1, do_sample=False, min_new_tokens=21,
                                           max_new_tokens=21))  # fmt: skip
        equal += (outputs[0] == outputs[1]).float().mean().item()
    return equal / images


def decode_part(args, device: torch.device, report: Report, budget: Budget) -> None:
    bandwidth = args.read_bandwidth or read_bandwidth(device, args.tiny)
    floor_ms = decode_family("itune", lambda: ituning_native(args.tiny), bandwidth, args, device, report, budget)
    if budget.left() >= 30:
        ved = build_on(device, lambda: common.build_ved("gpt2-large", args.tiny)).to(torch.bfloat16).eval()
        row = per_token_ms(ved, decode_inputs(ved, 1, device), "default", args.decode_repeats)
        row["weight_bytes"] = weight_bytes(ved)
        row["times_itune_floor"] = row["ms_per_token"] / floor_ms
        report.add("decode", "ved:default", row)
        del ved
        release()
    if budget.left() >= 30:
        decode_family("xgpt", lambda: xgpt_native(args.tiny), bandwidth, args, device, report, budget)
    else:
        report.add("decode", "xgpt:floor", {"skipped": f"{budget.left():.0f} s of the budget left"})


def decode_family(name: str, builder, bandwidth: float, args, device, report: Report, budget: Budget) -> float:
    """One family's batch-1 greedy decoding on every path of `GREEDY_PATHS` against its floor, into `report`'s decode
    part.

    Args:
        name: The rows' prefix (`itune`, `xgpt`).
        builder: Builds the model (random weights).
        bandwidth: The device's read bytes per second (the floor's denominator).
        args, device, report, budget: As the other parts take them.

    Returns:
        The floor, ms per token.
    """
    model = build_on(device, builder).to(torch.bfloat16).eval()
    floor_ms = 1000 * weight_bytes(model) / bandwidth
    report.add("decode", f"{name}:floor", {"weight_bytes": weight_bytes(model), "read_bytes_per_s": bandwidth,
                                            "floor_ms_per_token": floor_ms})  # fmt: skip
    inputs = decode_inputs(model, 1, device)
    for path in GREEDY_PATHS:
        if budget.left() < (args.decode_compile_s if path == "fast" else 20):
            report.add("decode", f"{name}:{path}", {"skipped": f"{budget.left():.0f} s of the budget left"})
            continue
        row, key = {}, f"{name}:{path}"
        try:
            skips = cudagraph_skips()
            row = per_token_ms(model, inputs, path, args.decode_repeats)
            row["times_floor"] = row["ms_per_token"] / floor_ms
            row["cudagraph_skips"] = cudagraph_skips() - skips
            if path != "default":  # the timing is recorded first: the agreement's 8 images compile another shape
                report.add("decode", key, row)
                row["greedy_token_agreement_bf16"] = agreement(model, device, path)
        except Exception as error:
            traceback.print_exc()
            row = {**row, "error": f"{type(error).__name__}: {str(error)[:600]}"}
        report.add("decode", key, row)
    del model
    release()
    return floor_ms


# ------------------------------------------------------------------------------------------------ against VED
VED_TREATMENTS = (
    "fp32", "bf16", "bf16+flash+aligned+graphed", "bf16+flash+aligned+compiled", "bf16+flash+aligned+cudagraphs",
)  # fmt: skip


def ved_part(args, device: torch.device, report: Report, budget: Budget) -> None:
    models = {
        "ved": build_on(device, lambda: freeze(common.build_ved("gpt2-large", args.tiny))),
        "itune": build_on(device, lambda: common.build_ituning("gpt2-large", args.tiny, drop=False)),
    }
    inputs = {
        "ved": step_inputs(models["ved"], args.ved_batch, device, pixels=True),
        "itune": step_inputs(models["itune"], args.ved_batch, device),
    }
    for model in models.values():
        model.train()
    args.profile = False
    for treatment in VED_TREATMENTS:
        if treatment != "fp32":
            for model in models.values():
                frozen_matrices_to_bf16(model)  # once: later calls find no fp32 matrix left
        rows = {}
        for name, model in models.items():
            needs = budget_needed(treatment, args)
            if budget.left() < needs:
                rows[name] = {"skipped": f"{budget.left():.0f} s of the budget left, {needs} s needed"}
                continue
            try:
                rows[name] = measure_treatment(treatment, model, inputs[name], args, device)
            except Exception as error:
                traceback.print_exc()
                rows[name] = {"error": f"{type(error).__name__}: {str(error)[:600]}"}
        if all("ms_per_step" in row for row in rows.values()):
            rows["itune_speedup"] = rows["ved"]["ms_per_step"] / rows["itune"]["ms_per_step"]
        report.add("ved", f"batch_{args.ved_batch}:{treatment}", rows)
    del models, inputs
    release()


def freeze(model):
    common.freeze_ved_backbones(model)
    return model


# ------------------------------------------------------------------------------------------------ captions/s
def captions_part(args, device: torch.device, report: Report, budget: Budget) -> None:
    for name, builder, paths in (
        ("itune", lambda: ituning_native(args.tiny), ("default", "fast")),
        ("ved", lambda: common.build_ved("gpt2-large", args.tiny), ("default",)),
        ("xgpt", lambda: xgpt_native(args.tiny), ("default", "fast")),
    ):
        model = build_on(device, builder).to(torch.bfloat16).eval()
        for batch in (16, 128):
            for beams in (1, 5):
                for path in paths:
                    key = f"{name}:{path}:batch_{batch}:beam_{beams}"
                    if budget.left() < (args.decode_compile_s if path == "fast" else 30):
                        report.add("captions", key, {"skipped": f"{budget.left():.0f} s of the budget left"})
                        continue
                    try:
                        seconds = generate_seconds(model, decode_inputs(model, batch, device), 20, beams, path, 2)
                        row = {"captions_per_s": batch / common.median(seconds), "seconds": seconds}
                    except Exception as error:
                        traceback.print_exc()
                        row = {"error": f"{type(error).__name__}: {str(error)[:600]}"}
                    report.add("captions", key, row)
        del model
        release()


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {', '.join(PARTS)}")
    parser.add_argument("--treatments", default=",".join(TREATMENTS), help="the step-N parts' treatments")
    parser.add_argument("--ablations", default=",".join(ABLATIONS), help="the ablations-N parts' treatments")
    parser.add_argument("--ved-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per treatment (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--decode-repeats", type=int, default=5)
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--profile-treatments", default=",".join(PROFILED), help="the treatments profiled (their resolved names)"
    )
    parser.add_argument("--compile-s", type=int, default=150, help="budget a compiled treatment needs to start")
    parser.add_argument(  # a decode step is one forward at batch 1, a training step a forward and a backward
        "--decode-compile-s", type=int, default=100, help="budget the decoding fast path needs to start"
    )
    parser.add_argument("--budget-s", type=float, default=480, help="stop starting work after this many seconds")
    parser.add_argument("--tiny", action="store_true", help="tiny random presets (smoke run; figures meaningless)")
    parser.add_argument(
        "--compile-backend", default="inductor", help="torch.compile's backend on the fast path (smoke runs: eager)"
    )
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--read-bandwidth", type=float, help=argparse.SUPPRESS)  # the peak part's, to the others
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # run the parts in this process
    args = parser.parse_args(argv)
    decoding.BACKEND = args.compile_backend  # the fast path's, in this process and the parts' (passed on)
    parts = [p for p in args.parts.split(",") if p]
    if unknown := sorted(p for p in set(parts) - set(PARTS) if not batch_part(p)):
        parser.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    device = torch.device(args.device)
    info = common.machine(device)
    if not args.worker:
        common.print_machine(info)
    report = Report(args.json, {"machine": info, "arguments": vars(args)})
    budget = Budget(args.budget_s)
    for part in parts:
        if budget.left() < 20:
            report.add(part, "skipped", f"{budget.left():.0f} s of the budget left")
            continue
        started = time.monotonic()
        if args.worker:
            run_part(part, args, device, report, budget)
        else:  # a fresh process per part: a failed CUDA graph capture or compile cannot spoil the next part
            run_in_process(part, args, report, budget)
        if not args.worker:
            report.add(part, "seconds", time.monotonic() - started)
    return 0


def batch_part(part: str) -> bool:
    """Whether `part` is a step part at a batch size of its own (`step-N`, `ablations-N`)."""
    name, _, batch = part.partition("-")
    return name in ("step", "ablations") and batch.isdigit()


def run_part(part: str, args, device: torch.device, report: Report, budget: Budget) -> None:
    try:
        if part == "peak":
            report.add("peak", "matmul_bf16_tflops", matmul_peak(device, args.tiny))
            report.add("peak", "read_bandwidth_bytes_per_s", read_bandwidth(device, args.tiny))
        elif part.startswith(("step-", "ablations-")):
            name, _, batch = part.partition("-")
            treatments = (args.treatments if name == "step" else args.ablations).split(",")
            step_part(int(batch), treatments, args, device, report, budget)
        else:
            {"decode": decode_part, "ved": ved_part, "captions": captions_part}[part](args, device, report, budget)
    except Exception as error:
        traceback.print_exc()
        report.add(part, "error", f"{type(error).__name__}: {str(error)[:600]}")


def run_in_process(part: str, args, report: Report, budget: Budget) -> None:
    """`part` in a fresh Python process (`--worker`), its measurements merged into `report`."""
    bandwidth = args.read_bandwidth or report.payload.get("peak", {}).get("read_bandwidth_bytes_per_s")
    options = {
        "--device": args.device, "--parts": part, "--treatments": args.treatments, "--ablations": args.ablations,
        "--ved-batch": args.ved_batch,
        "--steps": args.steps, "--warmup": args.warmup, "--decode-repeats": args.decode_repeats,
        "--profile-treatments": args.profile_treatments, "--compile-s": args.compile_s,
        "--decode-compile-s": args.decode_compile_s, "--budget-s": budget.left(),
        "--compile-backend": args.compile_backend,
        **({"--read-bandwidth": bandwidth} if bandwidth else {}),
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "part.json"
        command = [
            sys.executable,
            __file__,
            "--worker",
            "--json",
            str(out),
            "--profile" if args.profile else "--no-profile",
        ]
        command += [str(item) for option in options.items() for item in option] + (["--tiny"] if args.tiny else [])
        status = subprocess.run(command).returncode
        measured = json.loads(out.read_text()) if out.exists() else {}
    for section, values in measured.items():
        if section not in ("machine", "arguments"):
            for key, value in values.items():
                report.add(section, key, value, echo=False)
    if status:
        report.add(part, "exit_status", status)


if __name__ == "__main__":
    sys.exit(main())
