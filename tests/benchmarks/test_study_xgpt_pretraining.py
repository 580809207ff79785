"""`benchmarks/study_xgpt_pretraining.py`: the chain of `itune` commands each seed runs, its resumption and its
table, with the commands recorded instead of run (the commands themselves are tested in test_xgpt_pretraining.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: make test-fast skips them

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_xgpt_pretraining.py"


@pytest.fixture
def study(monkeypatch):
    spec = importlib.util.spec_from_file_location("study_xgpt_pretraining", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls: list[list[str]] = []

    def fake_itune(*args) -> str:  # what each command leaves behind, with a score that names its run
        args = [str(a) for a in args]
        calls.append(args)
        out = Path(args[args.index("--output-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if args[0] == "cache-features":
            (out / "fingerprint.json").write_text("{}")
        elif args[0] in ("train", "average-checkpoints"):
            (out / "model.safetensors").write_text("")
            if args[0] == "train":
                (out / "checkpoints" / "step-1").mkdir(parents=True)
            steps = int(args[args.index("--max-steps") + 1]) if args[0] == "train" else 0
            (out / "train_summary.json").write_text(json.dumps({"steps": steps}))
        elif args[0] == "eval":  # seed 0 writes one caption for every image, seed 1 two
            seed = int(Path(args[args.index("--model") + 1]).name.rsplit("-", 1)[1])
            captions = [{"caption": f"caption {i % (seed + 1)}"} for i in range(3)]
            (out / "captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in captions))
            return json.dumps({"CIDEr": 0.1 * (seed + 1)}) + "\n"
        return ""

    monkeypatch.setattr(module, "itune", fake_itune)
    module.calls = calls
    return module


def run_study(study, monkeypatch, work: Path, *extra: str) -> None:
    sizes = ["--alt-images", "6", "--domain-images", "6", "--test-images", "3", "--seeds", "2"]
    steps = ["--pretrain-steps", "8", "--stage2-steps", "4", "--finetune-steps", "5"]
    argv = ["study", "--work-dir", str(work), *sizes, *steps, *extra]
    monkeypatch.setattr(sys, "argv", argv)
    study.main()


def trained(calls, name: str) -> list[str]:
    return next(call for call in calls if call[0] == "train" and call[call.index("--output-dir") + 1].endswith(name))


def option(call: list[str], flag: str) -> str:
    return call[call.index(flag) + 1]


def test_each_seed_pretrains_its_own_chain_and_finetunes_from_its_averages(study, monkeypatch, tmp_path, capsys):
    run_study(study, monkeypatch, tmp_path, "--conditions", "none,ic,ic+ida,all,two-stage,all-multi")
    calls, work = study.calls, tmp_path.resolve()
    for seed in (0, 1):
        stage1 = trained(calls, f"pre-all-{seed}")
        assert option(stage1, "--seed") == str(seed) and option(stage1, "--tasks") == "ic,imlm,ida,tifg"
        assert option(stage1, "--max-steps") == "8" and option(stage1, "--data").endswith("alt-text/dataset.json")
        stage2 = trained(calls, f"pre-stage2-{seed}")
        assert option(stage2, "--init-model") == str(work / f"pre-all-{seed}-top4")
        assert option(stage2, "--task-weights") == "1,0.3,0.3,0.3" and option(stage2, "--max-steps") == "4"
        assert option(trained(calls, f"pre-all-multi-{seed}"), "--ida-masking") == "multi"
        assert "--tasks" not in trained(calls, f"pre-ic-{seed}")
        assert option(trained(calls, f"pre-ic+ida-{seed}"), "--tasks") == "ic,ida"
        assert "--init-model" not in trained(calls, f"ft-none-{seed}")
        for condition, start in (("ic", "pre-ic"), ("ic+ida", "pre-ic+ida"), ("all", "pre-all"),
                                 ("two-stage", "pre-stage2"), ("all-multi", "pre-all-multi")):  # fmt: skip
            finetune = trained(calls, f"ft-{condition}-{seed}")
            assert option(finetune, "--init-model") == str(work / f"{start}-{seed}-top4")
            assert "--tasks" not in finetune and option(finetune, "--max-steps") == "5"
            assert option(finetune, "--keep-checkpoints") == "1" and option(stage1, "--keep-checkpoints") == "4"
    assert not list(work.glob("*/checkpoints"))  # once averaged or scored, a run's checkpoints are deleted
    rows = [json.loads(line) for line in (work / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {row["CIDEr"] for row in rows} == {0.1, 0.2}
    table = capsys.readouterr().out
    assert "| no pre-training | 2 | 15.0 | 7.1 | 10.0, 20.0 | 1, 2 |" in table  # x100, sd over the seeds
    assert "IDA with one [MASK] per token | 2 | 15.0" in table
    blind = json.loads((work / "blind.json").read_text())  # a constant caption, chosen on the training split
    train = json.loads((work / "in-domain" / "dataset.json").read_text())["images"]
    assert blind["caption"] in {s["raw"] for image in train if image["split"] == "train" for s in image["sentences"]}
    assert 0 < blind["CIDEr"] and f'image-blind floor: "{blind["caption"]}" for every image' in table


def test_a_cut_short_study_resumes_and_refuses_runs_of_other_lengths(study, monkeypatch, tmp_path, capsys):
    run_study(study, monkeypatch, tmp_path, "--conditions", "none,ic", "--seeds", "1")
    study.calls.clear()
    run_study(study, monkeypatch, tmp_path, "--conditions", "none,ic")  # seed 0 is done: only seed 1 runs
    assert {call[call.index("--output-dir") + 1].rsplit("/", 1)[1] for call in study.calls if call[0] == "train"} \
        == {"pre-ic-1", "ft-none-1", "ft-ic-1"}  # fmt: skip
    with pytest.raises(SystemExit):
        run_study(study, monkeypatch, tmp_path, "--conditions", "none,ic+mlm")
    assert "unknown ic+mlm" in capsys.readouterr().err
    (tmp_path / "results.jsonl").unlink()
    with pytest.raises(SystemExit, match="holds a run of 5 steps, not 9"):
        run_study(study, monkeypatch, tmp_path, "--conditions", "none", "--finetune-steps", "9")
