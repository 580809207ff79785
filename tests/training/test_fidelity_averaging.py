"""Top-k checkpoint averaging (XGPT section 5.4: "an average of the top-4 pre-trained weights"): a run keeps its best
checkpoints by validation on disk (plus the newest), averaging ranks by every validation the run recorded, and what
was not ranked by validation (no validation at all, a better step without a checkpoint) is said."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType
from safetensors.torch import load_file, save_file

from itune_hf.cli import main
from itune_hf.training.averaging import average_checkpoints, choose_checkpoints
from itune_hf.training.checkpoints import Checkpointer, TrainingState, checkpoints_to_keep

KEY = "layer.weight"


def paths(steps) -> list[Path]:
    return [Path(f"/run/checkpoints/step-{s:07d}") for s in steps]


def test_the_newest_and_the_best_others_are_kept_and_without_validation_the_newest():
    scores = {2: 0.9, 4: 0.5, 5: 0.7}
    kept = checkpoints_to_keep(paths(range(1, 7)), scores, keep=3)
    assert [p.name for p in kept] == ["step-0000006", "step-0000002", "step-0000005"]
    assert [p.name for p in checkpoints_to_keep(paths(range(1, 7)), {}, keep=3)] == [
        "step-0000006", "step-0000005", "step-0000004"
    ]  # fmt: skip
    assert checkpoints_to_keep(paths(range(1, 7)), scores, keep=1) == paths([6])


class FakeAccelerator:
    """What `Checkpointer.save` asks of Accelerate, on one process: the weights of the step as its state."""

    is_main_process = True
    distributed_type = DistributedType.NO

    def __init__(self) -> None:
        self.step = 0

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, directory: str) -> None:
        save_file({KEY: torch.full((2,), float(self.step))}, str(Path(directory) / "model.safetensors"))


def write_run(tmp_path, scores: dict[int, float], steps=range(1, 7), keep: int = 3) -> Path:
    """A run saved at `steps` (the weights of step s are all s), validated at the steps of `scores`, with
    `Checkpointer` pruning as training does."""
    accelerator, state = FakeAccelerator(), TrainingState(total_steps=max(steps))
    checkpointer = Checkpointer(accelerator, tmp_path, keep=keep)
    for step in steps:
        state.step = accelerator.step = step
        if step in scores:
            state.history.append({"step": step, "val": {"CIDEr": scores[step], "BLEU-4": 0.1}})
        checkpointer.save(state)
    save_file({KEY: torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "train_summary.json").write_text(json.dumps({"history": dataclasses.asdict(state)["history"]}))
    return tmp_path


def on_disk(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_training_keeps_the_best_validated_checkpoints_and_averaging_takes_them(tmp_path):
    run = write_run(tmp_path, {1: 0.2, 2: 0.9, 3: 0.8, 4: 0.1, 5: 0.3, 6: 0.0}, keep=3)
    assert on_disk(run) == ["step-0000002", "step-0000003", "step-0000006"]  # the two best and the newest
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = average_checkpoints(run, tmp_path / "avg", top=2)
    assert report["checkpoints"] == ["step-0000002", "step-0000003"] and report["scores"] == [0.9, 0.8]
    assert torch.allclose(load_file(tmp_path / "avg" / "model.safetensors")[KEY], torch.full((2,), 2.5))
    assert report["warnings"] == [] and not caught  # all ranked by validation: nothing to say


def test_a_better_step_without_a_checkpoint_is_named(tmp_path):
    run = write_run(tmp_path, {1: 0.95, 2: 0.9, 3: 0.8, 4: 0.85, 5: 0.7, 6: 0.6}, keep=3)
    assert on_disk(run) == ["step-0000001", "step-0000002", "step-0000006"]
    shutil.rmtree(run / "checkpoints" / "step-0000001")  # as a run pruned by age leaves it
    with pytest.warns(UserWarning, match=r"step\(s\) 1, 3, 4, 5 scored better .* raise --keep-checkpoints"):
        report = average_checkpoints(run, tmp_path / "avg", top=2)
    assert report["checkpoints"] == ["step-0000002", "step-0000006"] and len(report["warnings"]) == 1


def test_unscored_checkpoints_rank_after_the_scored_ones_and_are_named(tmp_path):
    run = write_run(tmp_path, {2: 0.9}, keep=3)  # validated once: 6 and 5 are kept unscored (the newest others)
    with pytest.warns(UserWarning, match="step-0000006 had no validation score"):
        report = average_checkpoints(run, tmp_path / "avg", top=2)
    assert report["checkpoints"] == ["step-0000002", "step-0000006"]


def test_a_damaged_history_scores_nothing_and_is_no_traceback(tmp_path):
    run = write_run(tmp_path, {2: 0.9, 3: 0.8})
    (run / "checkpoints" / "step-0000006" / "progress.json").write_text("[]")  # a list, not a mapping
    (run / "train_summary.json").write_text(json.dumps({"history": [1, {"step": "x", "val": []}, None]}))
    report = average_checkpoints(run, tmp_path / "avg", top=2)  # an entry that is no mapping scores nothing
    assert report["checkpoints"] == ["step-0000002", "step-0000003"] and report["scores"] == [0.9, 0.8]


def test_without_validation_the_newest_are_averaged_and_the_command_says_so(tmp_path, capsys):
    run = write_run(tmp_path, {}, keep=3)
    assert [c.name for c in choose_checkpoints(run, 4)] == ["step-0000006", "step-0000005", "step-0000004"]
    assert main(["average-checkpoints", str(run), "--output-dir", str(tmp_path / "avg"), "--top", "2"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "no validation score" in err and "newest 2 (step-0000006, step-0000005)" in err
    averaged_from = json.loads((tmp_path / "avg" / "averaged_from.json").read_text())
    assert averaged_from["checkpoints"] == ["step-0000006", "step-0000005"] and averaged_from["warnings"]


# ------------------------------------------------------------------------------------------------------------------
# Averaging owns its output, writes it atomically, and verifies what it averages
# ------------------------------------------------------------------------------------------------------------------
def test_averaging_refuses_a_foreign_directory_and_the_run_itself_and_overwrite_names_what_it_removes(tmp_path, capsys):
    run = write_run(tmp_path / "run", {2: 0.9, 3: 0.8})
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "README.md").write_text("my notes")
    argv = ["average-checkpoints", str(run), "--top", "2", "--output-dir"]
    assert main([*argv, str(other)]) == 2
    assert "holds files itune average-checkpoints did not write (README.md)" in capsys.readouterr().err
    assert (other / "README.md").read_text() == "my notes" and not (other / "model.safetensors").exists()
    before = (run / "model.safetensors").read_bytes()
    assert main([*argv, str(run)]) == 2
    assert "is the run itself" in capsys.readouterr().err and (run / "model.safetensors").read_bytes() == before
    assert main([*argv, str(other), "--overwrite"]) == 0
    assert "--overwrite: removing 1 entries" in capsys.readouterr().err and not (other / "README.md").exists()
    assert main([*argv, str(other)]) == 0  # a previous average is its own output: written again


def test_a_kill_while_the_average_is_written_leaves_the_previous_model_whole(tmp_path, monkeypatch):
    import safetensors.torch

    run, out = write_run(tmp_path / "run", {2: 0.9, 3: 0.8}), tmp_path / "avg"
    average_checkpoints(run, out, top=2)
    before = (out / "model.safetensors").read_bytes()

    def killed_midway(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 10)  # half a file
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(safetensors.torch, "save_file", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        average_checkpoints(run, out, top=1)
    assert (out / "model.safetensors").read_bytes() == before
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert not (out / "averaged_from.json").exists()  # unfinished: the next average rewrites it
    assert not (out / ".itune-train.lock").exists()


def test_damaged_and_non_finite_checkpoints_are_not_averaged_and_fewer_than_top_is_said(tmp_path, capsys):
    run = write_run(tmp_path / "run", {4: 0.9, 5: 0.8, 6: 0.7})
    weights = run / "checkpoints" / "step-0000004" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = b"\xff" * 8  # NaN bytes behind an intact header: the manifest's checksum differs
    weights.write_bytes(bytes(data))
    with pytest.warns(UserWarning) as caught:
        report = average_checkpoints(run, tmp_path / "avg", top=4)
    assert report["checkpoints"] == ["step-0000005", "step-0000006"]
    messages = " ".join(str(w.message) for w in caught)
    assert "step-0000004: model.safetensors differs from the file saved (checksum mismatch): left out" in messages
    assert "averaged 2 checkpoint(s), not the 4 asked for (--top 4)" in messages

    from itune_hf.training.checkpoints import write_manifest

    for step in (5, 6):  # NaN weights saved as such (a diverged run): manifests intact
        checkpoint = run / "checkpoints" / f"step-{step:07d}"
        save_file({KEY: torch.full((2,), float("nan"))}, str(checkpoint / "model.safetensors"))
        write_manifest(checkpoint)
    capsys.readouterr()
    assert main(["average-checkpoints", str(run), "--output-dir", str(tmp_path / "avg2")]) == 2
    assert "1 of 1 tensors hold NaN or infinite values (e.g. layer.weight)" in capsys.readouterr().err


def test_averaging_a_run_that_is_still_training_is_refused_naming_it(tmp_path, capsys):
    from conftest import held_by_a_live_process

    run = write_run(tmp_path / "run", {}, keep=3)
    with held_by_a_live_process(run, "a training run") as pid:  # it rotates checkpoints while they would be read
        assert main(["average-checkpoints", str(run), "--output-dir", str(tmp_path / "avg"), "--top", "2"]) == 2
    err = capsys.readouterr().err
    assert f"is in use by a training run (pid {pid}" in err and not (tmp_path / "avg").exists()
    assert main(["average-checkpoints", str(run), "--output-dir", str(tmp_path / "avg"), "--top", "2"]) == 0
    assert not (run / ".itune-train.lock").exists()  # the run's lock is given back


def test_checkpoints_or_a_model_of_other_shapes_are_refused_naming_the_weight(tmp_path, capsys):
    from itune_hf.training.checkpoints import write_manifest

    run = write_run(tmp_path / "run", {4: 0.9, 5: 0.8, 6: 0.7})
    save_file({KEY: torch.zeros(3)}, str(run / "model.safetensors"))  # the run's model: another shape
    assert main(["average-checkpoints", str(run), "--output-dir", str(tmp_path / "avg")]) == 2
    assert f"weight {KEY} has shape (2,), (3,) in the model of" in capsys.readouterr().err
    assert not (tmp_path / "avg" / "model.safetensors").exists()

    save_file({KEY: torch.zeros(2)}, str(run / "model.safetensors"))
    checkpoint = run / "checkpoints" / "step-0000005"  # another run's checkpoint, copied in whole
    save_file({KEY: torch.zeros(3)}, str(checkpoint / "model.safetensors"))
    write_manifest(checkpoint)
    assert main(["average-checkpoints", str(run), "--output-dir", str(tmp_path / "avg2")]) == 2
    err = capsys.readouterr().err
    assert "step-0000005: weight layer.weight has shape (3,), (2,) in" in err and "Traceback" not in err
