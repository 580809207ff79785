"""The model benchmarks run as a user runs them (`python benchmarks/bench_X.py`), at tiny size, once each.

Smoke tests only: they check that each script finishes and writes a well-formed table and JSON; timings are never
asserted (they mean nothing at this size, and the machine is shared).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from metrics_support import requires_coco
from script_support import load_script
from torch import nn

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_script(name: str, tmp_path: Path, *arguments: str) -> tuple[str, dict]:
    out = tmp_path / f"{name}.json"
    result = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / name),
            "--tiny",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--json",
            str(out),
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(out.read_text())


def table_rows(stdout: str, header_start: str) -> list[list[str]]:
    """The body rows of the markdown table whose header starts with `header_start`, split into cells."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    assert set(lines[start + 1]) <= set("|-")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_training_benchmark_all_variants(tmp_path):
    stdout, data = run_script("bench_training.py", tmp_path, "--warmup", "0", "--skip-memory")
    rows = table_rows(stdout, "| variant |")
    assert [row[0][:3] for row in rows] == ["(a)", "(b)", "(c)", "(d)", "(e)"]
    assert all(len(row) == 9 and row[-1] == "-" for row in rows)  # no compiled variant: no compiled-vs-eager ratio
    assert set(data["rows"]) == set("abcde") and len(data["runs"]) == 5
    trainable = {v: row["trainable_params"] for v, row in data["rows"].items()}
    # Frozen backbones train far fewer parameters; dropping trains fewer modules; (c) and (d) are the same model.
    assert trainable["a"] > trainable["b"] > 0 and trainable["c"] == trainable["d"] > trainable["e"] > 0
    assert all(row["median_ms"] > 0 for row in data["rows"].values())
    assert [t["target"][:3] for t in data["targets"]] == ["(d)", "(d)", "(e)"]  # memory skipped: no memory target


def test_training_benchmark_counts_flops_per_step(tmp_path):
    stdout, data = run_script("bench_training.py", tmp_path, "--flops", "--variants", "bcd")
    counts = data["gflop_per_step"]
    assert set(counts) == set("bcd") and all(value > 0 for value in counts.values())
    assert counts["c"] > counts["d"]  # from pixels: the tower's forward pass is counted too
    assert data["flop_ratio_vs_b"]["b"] == 1.0 and "FLOP ratio (b)/(d)" in stdout


def test_training_benchmark_counts_eager_variants_only(tmp_path):
    command = [sys.executable, str(BENCHMARKS / "bench_training.py"), "--tiny", "--flops", "--variants", "dD"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2 and "--flops counts the eager variants only" in result.stderr


def test_training_benchmark_measures_memory_in_fresh_processes(tmp_path):
    stdout, data = run_script("bench_training.py", tmp_path, "--warmup", "0", "--variants", "d")
    assert [row[0][:3] for row in table_rows(stdout, "| variant |")] == ["(d)"]
    assert set(data["memory"]) == {"d"}
    assert all(run["peak_bytes"] > 0 and run["peak_reset"] for run in data["memory"].values())
    assert all(row["peak_gb"] > 0 for row in data["rows"].values())
    assert "| target |" not in stdout  # no pair of variants to compare


def test_generation_benchmark(tmp_path):
    stdout, data = run_script("bench_generation.py", tmp_path, "--batch-sizes", "1,2", "--kv-per-beam")
    rows = table_rows(stdout, "| decoding | batch | VED")
    assert [(row[0], row[1]) for row in rows] == [("greedy", "1"), ("beam 5", "1"), ("greedy", "2"), ("beam 5", "2")]
    assert all(row[-1] in ("met", "missed") for row in rows)
    assert len(data["runs"]) == 4 * 4  # settings x models (with the K/V-per-beam-copy baseline)
    assert all(run["captions_per_s"] > 0 for run in data["runs"])
    baseline = table_rows(stdout, "| decoding | batch | K/V per beam copy")
    assert len(baseline) == 4 and all(row[-1].endswith("x") for row in baseline)
    assert all(row["shared_vs_per_beam"] > 0 for row in data["rows"])


def test_profile_benchmark(tmp_path):
    stdout, data = run_script("bench_profile.py", tmp_path, "--matmul-size", "256", "--decode-batch", "2")
    assert data["matmul_peak_gflops"] > 0
    cases = table_rows(stdout, "| case |")
    assert len(cases) == 3 and all(float(row[1]) > 0 for row in cases)
    assert all(case["gflop"] > 0 and 0 < case["fraction_of_peak"] for case in data["cases"])
    assert len(data["profiles"]) == 3
    assert all(profile["top"] and profile["top"][0]["self_cpu_ms"] > 0 for profile in data["profiles"].values())
    assert stdout.count("| operator |") == 3


def test_cpu_runtime_benchmark(tmp_path):
    out = tmp_path / "runtime.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_cpu_runtime.py"), "--tiny", "--steps", "1", "--loads", "idle"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout, "| load |")
    assert [row[1].split(":")[0] for row in rows] == ["before", "after"]
    assert rows[0][-1] == "1.00x" and rows[1][-1].endswith("x")
    data = json.loads(out.read_text())
    assert [row["setting"] for row in data["rows"]] == ["before", "after"]
    assert data["rows"][0]["runtime"] == "torch defaults"
    assert "freed memory kept for reuse" in data["rows"][1]["runtime"]


@requires_coco
def test_metrics_benchmark_with_the_itune_score_row():
    command = [sys.executable, str(BENCHMARKS / "bench_metrics.py"), "--images", "40", "--runs", "1"]
    result = subprocess.run(
        [*command, "--coco-runs", "1", "--cli-runs", "1"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = table_rows(result.stdout, "| implementation |")
    assert [row[0].split(" ")[0] for row in rows] == ["pycocoevalcap", "itune_hf.metrics", "itune"]
    assert rows[2][0].startswith("itune score (subprocess") and all(len(row) == 5 for row in rows)
    assert "scores identical (<= 1e-9): yes" in result.stdout


def test_meteor_benchmark_times_ours_and_what_meteor_adds_to_itune_score(tmp_path):
    from itune_hf.metrics.meteor import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    record = tmp_path / "meteor.json"
    command = [sys.executable, str(BENCHMARKS / "bench_meteor.py"), "--images", "40", "--runs", "1", "--no-jar"]
    subprocess.run([*command, "--output", str(record)], check=True, capture_output=True, timeout=600)
    rows = json.loads(record.read_text())["corpora"]
    assert [row["images"] for row in rows.values()] == [40, 4, 8, 8]
    assert all(0 <= row["METEOR"] <= 1 and row["ours_seconds"] > 0 for row in rows.values())
    assert all("meteor_adds_seconds" in row for name, row in rows.items() if not name.startswith("COCO-like 40 "))


def test_cpu_inference_benchmark(tmp_path):
    stdout, data = run_script("bench_cpu_inference.py", tmp_path, "--batch-sizes", "1,2", "--agreement-images", "3")
    rows = table_rows(stdout, "| decoding | batch | fp32 captions/s")
    assert [(row[0], row[1]) for row in rows] == [("greedy", "1"), ("beam 5", "1"), ("greedy", "2"), ("beam 5", "2")]
    names = list(data["rows"][0]["captions_per_s"])
    assert names[:3] == ["fp32", "fp32-opt", "int8"] and "shortlist" in names and names[-1] == "ved"
    assert all(run["captions_per_s"] > 0 for run in data["runs"]) and len(data["runs"]) == 4 * len(names)
    agreement = data["agreement"]
    assert set(agreement) == {"greedy", "beam 5"}
    assert all(agreement[d]["fp32"]["exact_match"] == 1.0 for d in agreement)
    assert all(agreement[d]["fp32-opt"]["exact_match"] == 1.0 for d in agreement)  # bit-exact default
    assert "target (>= 2x fp32 at beam 5, batch 2): met by" in stdout


def test_xgpt_benchmark_reports_training_and_captioning_for_both_families(tmp_path):
    stdout, data = run_script("bench_xgpt.py", tmp_path, "--warmup", "0", "--batch-sizes", "1", "--beams", "1,2")
    rows = table_rows(stdout, "| model |")
    assert [row[0] for row in rows] == ["itune", "xgpt-tiny", "xgpt-base"] and rows[0][3] == "1.00x"
    captioning = table_rows(stdout, "| captioning |")
    assert [row[0] for row in captioning] == ["batch 1, greedy", "batch 1, beam 2"]
    assert set(data["rows"]) == {"itune", "xgpt-tiny", "xgpt-base"}


def test_scale_benchmark_reports_steps_memory_flops_and_checkpoints(tmp_path):
    out = tmp_path / "scale.json"
    command = [sys.executable, str(BENCHMARKS / "bench_scale.py"), "--tiny", "--threads", "1", "--steps", "1",
               "--warmup", "0", "--batch-size", "2", "--caption-batch", "1", "--caption-tokens", "3",
               "--json", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout, "| workload |")
    names = [row[0] for row in rows]
    assert names == ["itune-features", "itune-images", "itune-drop", "xgpt-features", "tower",
                     "caption: itune, beam 5", "caption: xgpt, beam 2"]  # fmt: skip
    data = {row["workload"]: row for row in json.loads(out.read_text())["rows"]}
    for name in ("itune-features", "itune-images", "xgpt-features"):
        assert data[name]["flops_per_step"] > 0 and data[name]["trainable_parameters"] > 0
        # AdamW: two fp32 moments per trainable parameter; save_pretrained wrote at least the trainable weights
        assert data[name]["adamw_state_bytes"] == 8 * data[name]["trainable_parameters"]
        assert data[name]["save_pretrained_bytes"] >= 4 * data[name]["trainable_parameters"]
    # the I-Tuning adapter is saved without its frozen backbones; XGPT saves its whole stack
    assert data["itune-features"]["save_pretrained_bytes"] < 4 * data["itune-features"]["total_parameters"]
    assert data["tower"]["cached_bytes_per_image_fp16"] * 2 == data["tower"]["cached_bytes_per_image_fp32"]


def test_gpu_benchmark_runs_each_part_in_a_process_of_its_own_and_keeps_going_past_a_failure(tmp_path):
    out = tmp_path / "gpu.json"
    command = [sys.executable, str(BENCHMARKS / "bench_gpu.py"), "--tiny", "--device", "cpu", "--steps", "1",
               "--warmup", "0", "--decode-repeats", "1", "--parts", "peak,step-2,decode,ablations-3",
               "--json", str(out), "--treatments", "recorded,bf16+graphed,bf16+flash+aligned,bf16+math+aligned",
               "--ablations", "bf16+aligned", "--compile-backend", "eager"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["peak"]["read_bandwidth_bytes_per_s"] > 0
    step = data["step"]
    assert step["flops_batch_2"]["flops_per_step"] == 2 * step["flops_batch_2"]["per_caption"] > 0
    for treatment in ("recorded", "bf16+flash+aligned", "bf16+math+aligned"):
        assert step[f"batch_2:{treatment}"]["ms_per_step"] > 0
    assert set(step["batch_2:recorded"]["profile"]["phases"]) == {"forward", "backward", "optimizer"}
    assert "CUDA graphs need a CUDA device" in step["batch_2:bf16+graphed"]["error"]  # recorded; the run went on
    decode = data["decode"]
    assert decode["itune:floor"]["read_bytes_per_s"] == data["peak"]["read_bandwidth_bytes_per_s"]  # passed along
    for family in ("itune", "xgpt"):  # XGPT from cached tower states, on the same paths
        assert decode[f"{family}:floor"]["floor_ms_per_token"] > 0
        for path in ("fast", "default", "static"):
            assert decode[f"{family}:{path}"]["ms_per_token"] > 0, decode[f"{family}:{path}"]
        assert 0.0 <= decode[f"{family}:static"]["greedy_token_agreement_bf16"] <= 1.0
    assert decode["ved:default"]["ms_per_token"] > 0
    # the ablations part: its own treatments at its own batch, after the parts the issue puts first
    assert step["batch_3:bf16+aligned"]["ms_per_step"] > 0 and "batch_3:recorded" not in step
    assert step["flops_batch_3"]["flops_per_step"] == 3 * step["flops_batch_3"]["per_caption"]


def test_packing_benchmark_times_padded_packed_and_grouped_steps(tmp_path):
    out = tmp_path / "packing.json"
    command = [sys.executable, str(BENCHMARKS / "bench_packing.py"), "--tiny", "--rounds", "1", "--images", "40"]
    command += ["--batch-size", "8", "--threads", "1", "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    arms = json.loads(out.read_text())["arms"]
    assert list(arms) == ["padded", "packed", "grouped-padded", "grouped-packed"]
    assert arms["padded"]["speedup_vs_padded"] == 1.0 and "packed" in result.stdout
    padded, packed = arms["padded"], arms["packed"]
    assert packed["real_tokens_per_step"] == padded["real_tokens_per_step"]  # the same batches
    assert padded["real_tokens_per_step"] <= packed["lm_tokens_per_step"] <= padded["lm_tokens_per_step"]


def test_optimizer_benchmark_times_foreach_and_fused_adamw(tmp_path):
    out = tmp_path / "optimizer.json"
    command = [sys.executable, str(BENCHMARKS / "bench_optimizer.py"), "--tiny", "--rounds", "1", "--threads", "1"]
    result = subprocess.run(
        [*command, "--batch-size", "2", "--json", str(out)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    for model in ("xgpt-tiny-random", "itune-tiny-random"):
        row = data[model]
        assert row["trainable_parameters"] > 0 and row["fused_speedup_step"] > 0
        assert row["foreach"]["optimizer_ms"] > 0 and row["fused"]["optimizer_ms"] > 0
        assert f"| {model} |" in result.stdout


def test_cell_probe_reads_every_layer_of_a_tower_and_writes_its_record(tmp_path):
    from itune_hf.data import make_synthetic

    dataset = make_synthetic(tmp_path / "world", num_images=60, seed=3)
    record = tmp_path / "probe.json"
    command = [sys.executable, str(BENCHMARKS / "probe_cells.py"), str(dataset), "--preset", "itune-tiny-lite-random"]
    subprocess.run([*command, "--train", "40", "--test", "10", "--output", str(record)], check=True, timeout=300)
    data = json.loads(record.read_text())
    assert list(data["layers"]) == [f"hidden_states[{index}]" for index in range(5)] + ["output"]  # stem, 3, head
    assert data["layers"]["output"]["width"] == 32 and data["objects"]["train"] >= 40
    accuracies = [value for layer in data["layers"].values() for key, probes in layer.items() if key != "width"
                  for value in probes.values()]  # fmt: skip
    assert accuracies and all(0 <= accuracy <= 1 for accuracy in accuracies)


@pytest.fixture(scope="module")
def bench_gpu():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports _common
    try:
        yield load_script(BENCHMARKS / "bench_gpu.py")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_gpu_benchmarks_fast_rows_time_the_packages_fast_path(bench_gpu, monkeypatch):
    """bench_gpu.py's "fast" rows call `itune_hf.inference.decoding.fast_generate` with decoding="fast": the path
    `itune caption` and the pipeline take on a GPU (its captions are tested in tests/test_decoding.py)."""
    calls = []
    monkeypatch.setattr(bench_gpu, "fast_generate", lambda model, decoding, **kwargs: calls.append((decoding, kwargs)))
    bench_gpu.PATHS["fast"]("model", num_beams=5, max_new_tokens=3)
    assert calls == [("fast", {"num_beams": 5, "max_new_tokens": 3})]


def test_the_gpu_benchmarks_cudagraphs_lever_compiles_in_reduce_overhead_mode(bench_gpu, monkeypatch):
    """`cudagraphs` compiles the model in inductor's "reduce-overhead" mode (CUDA graphs) after a dynamo reset, so a
    graph compiled earlier without them cannot be reused; `compiled` alone compiles in the default mode."""
    calls, resets = [], []
    monkeypatch.setattr(bench_gpu.torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    monkeypatch.setattr(bench_gpu.torch._dynamo, "reset", lambda: resets.append(True))
    model = nn.Linear(2, 2)
    for levers in ({"bf16", "compiled"}, {"bf16", "cudagraphs"}):
        bench_gpu.prepare(levers, model, {}, bench_gpu.torch.device("cpu"))
    assert calls == [{"dynamic": False, "mode": None}, {"dynamic": False, "mode": "reduce-overhead"}]
    assert len(resets) == 1


def test_the_attention_lever_takes_the_backend_whose_eager_step_was_faster(bench_gpu):
    report = bench_gpu.Report(None, {"step": {"batch_8:bf16+flash+aligned": {"ms_per_step": 12.0},
                                              "batch_8:bf16+math+aligned": {"ms_per_step": 9.5},
                                              "batch_4:bf16+math+aligned": {"error": "out of memory"}}})  # fmt: skip
    assert bench_gpu.resolve_attention("bf16+attention+aligned+compiled", 8, report) == "bf16+math+aligned+compiled"
    report.payload["step"]["batch_8:bf16+flash+aligned"]["ms_per_step"] = 9.0
    assert (
        bench_gpu.resolve_attention("bf16+attention+aligned+cudagraphs", 8, report) == "bf16+flash+aligned+cudagraphs"
    )
    assert bench_gpu.resolve_attention("bf16+attention+compiled", 4, report) == "bf16+flash+compiled"  # none measured
    assert bench_gpu.resolve_attention("bf16+math+aligned", 8, report) == "bf16+math+aligned"  # nothing to resolve


def test_the_math_lever_turns_sdpas_fused_backends_off_for_its_treatment_only(bench_gpu):
    enabled = {name: getattr(bench_gpu.torch.backends.cuda, f"{name}_sdp_enabled") for name in bench_gpu.SDP_BACKENDS}
    before = {name: state() for name, state in enabled.items()}
    with bench_gpu.Levers({"bf16", "math"}):
        assert not any(state() for state in enabled.values())
    with bench_gpu.Levers({"bf16", "flash"}):
        assert not enabled["cudnn"]() and enabled["flash"]() == before["flash"]
    assert {name: state() for name, state in enabled.items()} == before


def test_a_failed_profile_keeps_the_treatments_timing(bench_gpu, monkeypatch):
    def fail(step):
        raise RuntimeError("CUPTI said no")

    monkeypatch.setattr(bench_gpu, "profile_step", fail)
    model = bench_gpu.ituning_peft(tiny=True)
    inputs = bench_gpu.step_inputs(model, 2, bench_gpu.torch.device("cpu"))
    args = argparse.Namespace(steps=1, warmup=0, profile=True, profile_treatments="recorded")
    row = bench_gpu.measure_treatment("recorded", model, inputs, args, bench_gpu.torch.device("cpu"))
    assert row["ms_per_step"] > 0 and row["profile_error"] == "RuntimeError: CUPTI said no" and "profile" not in row


def test_a_decoding_rows_timing_is_recorded_before_its_agreement_check(bench_gpu, monkeypatch):
    """The agreement check compiles another shape: a run stopped there (its limit) or failing keeps the timing."""
    seen = {}

    def fail(model, device, path):
        seen[path] = dict(report.payload["decode"][f"itune:{path}"])  # what the JSON held when the check began
        raise RuntimeError("out of memory")

    monkeypatch.setattr(bench_gpu, "per_token_ms", lambda model, inputs, path, repeats: {"ms_per_token": 2.0})
    monkeypatch.setattr(bench_gpu, "agreement", fail)
    report = bench_gpu.Report(None, {})
    args = argparse.Namespace(decode_compile_s=0, decode_repeats=1)
    builder = functools.partial(bench_gpu.ituning_native, True)
    budget = bench_gpu.Budget(60)
    bench_gpu.decode_family("itune", builder, 1e9, args, bench_gpu.torch.device("cpu"), report, budget)
    rows = report.payload["decode"]
    assert rows["itune:default"] == {"ms_per_token": 2.0, "times_floor": rows["itune:default"]["times_floor"],
                                     "cudagraph_skips": 0}  # fmt: skip
    for path in ("fast", "static"):
        assert seen[path]["ms_per_token"] == 2.0 and "error" not in seen[path]
        assert rows[f"itune:{path}"]["ms_per_token"] == 2.0
        assert rows[f"itune:{path}"]["error"] == "RuntimeError: out of memory"


def test_the_gpu_benchmarks_default_plan_puts_the_issues_priorities_first(bench_gpu):
    """Issue 50's order: the step at batch 512 (its compiled and CUDA-graphed treatments included), then batch-1
    decoding, then the rest; the single-lever ablations last, and no default treatment that once spoiled a process."""
    assert bench_gpu.PARTS[:3] == ("peak", "step-512", "decode") and bench_gpu.PARTS[-1] == "ablations-512"
    assert all(bench_gpu.batch_part(part) for part in ("step-512", "ablations-64")) and not bench_gpu.batch_part("step")
    assert sum(bool(bench_gpu.COMPILING & set(t.split("+"))) for t in bench_gpu.TREATMENTS) == 2
    for treatment in bench_gpu.TREATMENTS + bench_gpu.ABLATIONS + bench_gpu.VED_TREATMENTS:
        levers = set(treatment.split("+")) - {"recorded"}
        assert levers <= set(bench_gpu.LEVERS) and not {"compiled", "graphed"} <= levers, treatment


def test_decoding_benchmark_times_every_path_and_compares_the_captions(tmp_path):
    out = tmp_path / "decoding.json"
    command = [sys.executable, str(BENCHMARKS / "bench_decoding.py"), "--tiny", "--backend", "eager", "--repeats", "1",
               "--settings", "1x1,2x2", "--new-tokens", "4", "--json", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    for key in ("batch_1:beam_1", "batch_2:beam_2"):
        rows = data[key]
        paths = ("default", "auto", "fast", "fast-reproject", "fast-unpooled")
        assert [rows[path]["resolved"] for path in rows] == ["default", "default", "fast", "fast", "fast"]
        assert list(rows) == list(paths)
        assert all(row["captions_equal_default"] and row["captions_per_s"] > 0 for row in rows.values()), rows
        assert rows["default"]["speedup_over_default"] == 1.0
