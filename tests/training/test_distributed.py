"""Accelerate's engines beyond one machine's DDP: two nodes on one host (training, validation, shards
per node, checkpoints once, a node dying, resume), a rank killed mid-run (one line naming it; `--max_restarts`
resumes from the last checkpoint), and the FSDP config: on CPU processes DDP, said so; on GPUs, FSDP checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from itune_hf.cli import main
from itune_hf.data import make_synthetic

from conftest import accelerate_launch, free_port

pytestmark = pytest.mark.slow  # every test here launches processes

REPO = Path(__file__).resolve().parents[2]
TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
CPU = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
#: seconds a node may take; one still running after that is a hang, and the test says so
NODE_TIMEOUT = int(os.environ.get("ITUNE_TEST_NODE_TIMEOUT", "240"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("world") / "data", num_images=40, seed=3, image_size=32)


@pytest.fixture(scope="module")
def shards(world):
    """The world's 32 training pairs in 4 WebDataset shards of 8 (`itune make-shards`)."""
    out = Path(world).parent.parent / "shards"
    assert main(["make-shards", "--data", str(world), "--output-dir", str(out), "--shard-size", "8"]) == 0
    return f"{out}/{{00000..00003}}.tar"


def node(rank: int, port: int, argv: list, log: Path) -> subprocess.Popen:
    """One of two `accelerate launch` invocations standing in for two machines (one process each), in a process
    group of its own so that the whole node (launcher and worker) can be killed."""
    options = ["--multi_gpu", "--num_machines", 2, "--num_processes", 2, "--machine_rank", rank]
    options += ["--main_process_ip", "127.0.0.1", "--main_process_port", port]
    return subprocess.Popen(
        accelerate_launch(options, argv), stdout=open(log.with_suffix(".out"), "w"),
        stderr=open(log.with_suffix(".err"), "w"), env=CPU, start_new_session=True,
    )  # fmt: skip


def finish(process: subprocess.Popen, what: str, log: Path) -> int:
    """`process`'s exit status, failing the test (not hanging it) when it runs past NODE_TIMEOUT."""
    try:
        return process.wait(timeout=NODE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"{what} still ran {NODE_TIMEOUT} s on (a hang); its stderr ends: {tail(log)}")


def tail(log: Path, suffix: str = ".err") -> str:
    return log.with_suffix(suffix).read_text()[-3000:]


def two_nodes(argv: list, logs: Path) -> list[int]:
    """Run `argv` on two nodes of one process each; their exit statuses."""
    port = free_port()
    nodes = [node(rank, port, argv, logs / f"node{rank}") for rank in (0, 1)]
    return [finish(n, f"node {rank}", logs / f"node{rank}") for rank, n in enumerate(nodes)]


def wait_for(path: Path, process: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + NODE_TIMEOUT
    while not path.is_dir():
        assert process.poll() is None, f"the run ended before {path.name}: {tail(log)}"
        assert time.time() < deadline, f"no {path.name} after {NODE_TIMEOUT} s: {tail(log)}"
        time.sleep(0.05)


WITH_PROC = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds a rank's worker through /proc")


def worker(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the launched worker of `rank` (the launcher's child whose environment says RANK=rank)."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    for pid in map(int, children):
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environment:
            return pid
    raise AssertionError(f"no worker of rank {rank} among {children}")


@WITH_PROC
def test_two_nodes_validate_checkpoint_once_name_a_dead_node_and_resume(world, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--output-dir", out, "--data", world, *TINY, "--max-steps", 6, "--save-every", 2]
    argv += ["--eval-every", 2, "--eval-max-images", 4, "--eval-max-new-tokens", 4, "--log-every", 1]
    port = free_port()
    first = [node(rank, port, argv, tmp_path / f"first{rank}") for rank in (0, 1)]
    wait_for(out / "checkpoints" / "step-0000002", first[0], tmp_path / "first0")
    os.kill(worker(first[1], 1), signal.SIGKILL)  # node 1 dies: its worker (a session of its own) and launcher
    os.killpg(first[1].pid, signal.SIGKILL)
    first[1].wait()
    assert finish(first[0], "node 0 after node 1 died", tmp_path / "first0") != 0
    said = tail(tmp_path / "first0")
    assert "itune train: error: rank 1 (pid" in said and "is gone: rank 0 of 2 stopped" in said, said
    assert "step-0000002, is kept" in said or "step-0000004, is kept" in said

    statuses = two_nodes([*argv, "--resume"], tmp_path)
    assert statuses == [0, 0], tail(tmp_path / "node0") + tail(tmp_path / "node1")
    assert "resumed from" in tail(tmp_path / "node0", ".out")
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 6 and summary["ranks_identical"]
    assert "| global batch (captions per optimizer step) | 8 |" in (out / "README.md").read_text()  # 2 x 4
    assert [h["step"] for h in summary["history"] if "val" in h][-2:] == [4, 6]  # validated across both nodes
    checkpoints = sorted((out / "checkpoints").iterdir())
    assert [c.name for c in checkpoints][-1] == "step-0000006" and not list(out.rglob("*.partial"))
    files = sorted(p.name for p in checkpoints[-1].iterdir())  # one set of weights (rank 0), each rank's RNG
    assert files == ["manifest.json", "model.safetensors", "optimizer.bin", "progress.json", "random_states_0.pkl",
                     "random_states_1.pkl", "scheduler.bin"]  # fmt: skip
    assert sum(t.numel() for t in load_file(checkpoints[-1] / "model.safetensors").values()) == 4256


def test_two_nodes_each_read_their_own_shards(shards, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--output-dir", out, "--data", shards, *TINY, "--max-steps", 2, "--eval-split", "none"]
    assert two_nodes(argv, tmp_path) == [0, 0], tail(tmp_path / "node0") + tail(tmp_path / "node1")
    assert "process 0 of 2 reads 2 of the 4 shards: 00000.tar, 00002.tar" in tail(tmp_path / "node0", ".out")
    assert "process 1 of 2 reads 2 of the 4 shards: 00001.tar, 00003.tar" in tail(tmp_path / "node1", ".out")
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["captions_seen"] == 16 and summary["ranks_identical"]


@WITH_PROC
def test_a_killed_rank_is_named_in_one_line_and_max_restarts_resumes_from_the_last_checkpoint(world, tmp_path):
    out, log = tmp_path / "run", tmp_path / "launch"
    argv = ["train", "--output-dir", out, "--data", world, *TINY, "--max-steps", 6, "--save-every", 2]
    options = ["--multi_gpu", "--num_processes", 2, "--num_machines", 1, "--main_process_port", free_port()]
    restarts = ["--max_restarts", 1, "--rdzv_backend", "c10d"]  # static: a restart may read the old addresses
    command = accelerate_launch([*options, *restarts], [*argv, "--eval-split", "none"])
    launcher = subprocess.Popen(command, stdout=open(log.with_suffix(".out"), "w"),
                                stderr=open(log.with_suffix(".err"), "w"), env=CPU, start_new_session=True)  # fmt: skip
    wait_for(out / "checkpoints" / "step-0000002", launcher, log)
    os.kill(worker(launcher, 1), signal.SIGKILL)
    assert finish(launcher, "the restarted run", log) == 0, tail(log)
    said = [line for line in tail(log).splitlines() if line.startswith("itune train: error:")]
    assert len(said) == 1 and "rank 1 (pid" in said[0] and "is gone" in said[0], tail(log)
    printed = tail(log, ".out")
    assert "elastic restart 1 of this launch: continuing from step-0000" in printed and "resumed from" in printed
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["ranks_identical"]


def test_the_fsdp_config_on_cpu_processes_trains_with_ddp_and_says_so(world, tmp_path):
    """Accelerate 1.15 shards with FSDP on accelerator process groups only (`AcceleratorState`); on CPU it ignores
    the FSDP config (or refuses it, with `fsdp_sync_module_states`). The shipped config runs there as DDP, saying so."""
    out = tmp_path / "run"
    options = ["--config_file", REPO / "examples" / "accelerate" / "fsdp.yaml", "--num_processes", 2]
    options += ["--main_process_port", free_port()]
    argv = ["train", "--output-dir", out, "--data", world, *TINY, "--max-steps", 2, "--eval-split", "none"]
    result = subprocess.run(accelerate_launch(options, argv), capture_output=True, text=True, timeout=300, env=CPU)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("warning: FSDP was asked for") == 1  # once, by the main process
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["distributed_type"] == "MULTI_CPU" and summary["processes"] == 2 and summary["ranks_identical"]


# ------------------------------------------------------------------------------------------------------------------
# FSDP on GPUs: run by the suite where CUDA is; skipped on CPU machines (see the test above and docs/scale.md)
# ------------------------------------------------------------------------------------------------------------------
GPUS = torch.cuda.device_count()


def first_losses(run: Path) -> list[float]:
    return [h["loss"] for h in json.loads((run / "train_summary.json").read_text())["history"] if "loss" in h]


@pytest.mark.skipif(GPUS == 0, reason="FSDP runs on accelerators only (Accelerate 1.15); see the CPU test above")
@pytest.mark.parametrize("preset", ["itune-tiny-random", "xgpt-tiny-random"])
def test_fsdp_on_gpus_matches_ddp_checkpoints_trainable_weights_once_and_resumes(world, tmp_path, preset):
    processes = min(GPUS, 2)
    argv = ["--data", world, "--preset", preset, "--batch-size", 4, "--report-to", "none", "--max-steps", 4]
    argv += ["--save-every", 2, "--eval-split", "none", "--log-every", 1, "--mixed-precision", "no"]
    config = REPO / "examples" / "accelerate" / "fsdp.yaml"
    fsdp = ["--config_file", config, "--num_processes", processes, "--main_process_port", free_port()]
    ddp = ["--multi_gpu", "--num_processes", processes, "--main_process_port", free_port()] if processes > 1 else []
    for name, options in (("fsdp", fsdp), ("ddp", ddp)):
        command = accelerate_launch(options, ["train", "--output-dir", tmp_path / name, *argv])
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "fsdp" / "train_summary.json").read_text())
    assert summary["distributed_type"] == "FSDP" and summary["processes"] == processes
    assert first_losses(tmp_path / "fsdp") == pytest.approx(first_losses(tmp_path / "ddp"), rel=1e-4)
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "step-0000004"
    frozen = sum(p.stat().st_size for p in (tmp_path / "fsdp" / "backbones").rglob("*.safetensors"))
    saved = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    assert sorted(p.name for p in (tmp_path / "fsdp" / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    assert frozen == 0 or saved < frozen / 2  # the frozen backbone is not written again into each checkpoint

    resumed = accelerate_launch(fsdp, ["train", "--output-dir", tmp_path / "fsdp", *argv, "--max-steps", 6, "--resume"])
    result = subprocess.run(resumed, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "resumed from" in result.stdout, result.stderr[-3000:]
    weights = "adapter_model.safetensors" if preset.startswith("itune") else "model.safetensors"
    exported = load_file(tmp_path / "fsdp" / weights)  # gathered whole from the shards
    assert exported and all(torch.isfinite(t).all() for t in exported.values())
    trained = load_file(tmp_path / "fsdp" / "checkpoints" / "step-0000006" / "model.safetensors")
    trained = {k.removeprefix("module.").replace(".ituning_modules.default.", ".ituning_modules."): t
               for k, t in trained.items()}  # fmt: skip
    same = [k for k in exported if k in trained]
    assert same and all(torch.equal(exported[k].cpu(), trained[k].cpu()) for k in same)  # the weights trained last
    summary = json.loads((tmp_path / "fsdp" / "train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["ranks_identical"] is None and len(summary["rank_adapter_checksums"]) == 1
