"""Self-critical sequence training (`itune_hf.training.scst`): the loss's gradient sign, the end of a
caption in the reward, only the adapter learning, resume mid-run, the CLI path and its bad inputs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from itune_hf.cli import main
from itune_hf.metrics import Metric, register_metric, unregister_metric
from itune_hf.training import TrainingConfig, train
from itune_hf.training.scst import (
    END_WORD,
    SelfCritical,
    caption_mask,
    ends_in_function_word,
    self_critical_loss,
    sequence_log_probs,
)

from conftest import synthetic_world, train_tiny_adapter

EOS = 0


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return synthetic_world(tmp_path_factory, "world", num_images=12, seed=3)


@pytest.fixture(scope="module")
def ce_run(world, tmp_path_factory):
    """A few cross-entropy steps of the tiny I-Tuning preset: what SCST starts from."""
    return train_tiny_adapter(world, tmp_path_factory.mktemp("ce") / "run", steps=2)


@pytest.fixture
def length_reward():
    """A registered reward that random tiny models earn too: the caption's length in words (their CIDEr is 0, which
    would leave nothing to learn from)."""

    def score(captions):
        lengths = [float(len(h.split())) for h in captions.hypotheses]
        return {"Words": (sum(lengths) / len(lengths), lengths)}

    register_metric(Metric("WORDS", keys=("Words",), score=score))
    yield "WORDS"
    unregister_metric("WORDS")


def scst_config(world, ce_run, output_dir, **options) -> TrainingConfig:
    settings = dict(
        output_dir=str(output_dir), data=str(world), preset="itune-tiny-random", batch_size=4, learning_rate=1e-2,
        eval_split="none", report_to="none", objective="scst", init_model=str(ce_run), max_caption_length=8,
        weight_decay=0.0, lr_schedule="constant", log_every=1,
    )  # fmt: skip
    return TrainingConfig(**{**settings, **options})


# ------------------------------------------------------------------------------------------------------ the loss


def test_a_sample_rewarded_above_its_baseline_gets_its_log_prob_raised_and_one_below_lowered():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)  # two captions, 5 positions, 7 words
    sequences = torch.tensor([[1, 3, 4, EOS, EOS], [1, 5, 6, 2, EOS]])
    mask, finished = caption_mask(sequences, prompt_length=1, eos_ids=[EOS])
    assert finished.tolist() == [True, True]
    before = sequence_log_probs(logits, sequences, mask).detach()
    loss = self_critical_loss(
        sequence_log_probs(logits, sequences, mask),
        rewards=torch.tensor([1.0, 0.0]),
        baselines=torch.tensor([0.5, 0.5]),
    )
    loss.backward()
    with torch.no_grad():
        logits -= 0.1 * logits.grad  # one descent step
    after = sequence_log_probs(logits, sequences, mask)
    assert after[0] > before[0] and after[1] < before[1]
    # only the caption's own tokens and its end token carry gradient: not the prompt, not the padding after the end
    assert logits.grad[0, 3:].abs().sum() == 0 and logits.grad[0, :3].abs().sum() > 0
    assert logits.grad[1, :4].abs().sum() > 0


def test_the_mask_counts_each_captions_first_end_token_and_nothing_after_and_a_cut_caption_is_unfinished():
    sequences = torch.tensor([[9, 3, EOS, EOS, EOS], [9, 3, 4, 5, 6], [9, EOS, EOS, 4, EOS]])
    mask, finished = caption_mask(sequences, prompt_length=1, eos_ids=[EOS])
    assert mask.int().tolist() == [[0, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert finished.tolist() == [True, False, True]


# ---------------------------------------------------------------------------------------------------- the reward


def reward_model(count_eos: bool = True, penalty: float = 0.0, reward: str = "CIDEr") -> SelfCritical:
    config = SimpleNamespace(
        scst_reward=reward, scst_count_eos=count_eos, scst_ending_penalty=penalty, max_caption_length=20, data="d"
    )
    references = [
        ["a red circle with a blue square", "a red circle beside a blue square", "a blue square and a red circle"],
        ["a green star on a white background", "a green star", "one green star on white"],
        ["two yellow triangles", "a pair of yellow triangles", "two triangles in yellow"],
    ]
    return SelfCritical(config, processor=None, references=references)


def test_the_end_of_a_finished_caption_counts_so_a_fragment_ending_scores_lower():
    fragment = ["a red circle with a"]
    with_end = reward_model(count_eos=True).rewards(fragment, [0], [True])[0][0]
    without_end = reward_model(count_eos=False).rewards(fragment, [0], [True])[0][0]
    assert with_end < without_end
    scst = reward_model()
    assert scst.references[0][0].endswith(END_WORD)
    (whole, cut), bad = scst.rewards(["a red circle with a blue square"] * 2, [0, 0], [True, False])
    assert whole > cut and bad == [False, False]  # a caption cut at the length limit has no end to match


def test_the_ending_penalty_lowers_the_reward_of_captions_ending_in_a_function_word():
    captions = ["a green star on a", "a green star"]
    plain, bad = reward_model().rewards(captions, [1, 1], [True, True])
    penalised, _ = reward_model(penalty=0.5).rewards(captions, [1, 1], [True, True])
    assert bad == [True, False]
    assert penalised[0] == pytest.approx(plain[0] - 0.5) and penalised[1] == plain[1]
    assert ends_in_function_word("a dog with") and not ends_in_function_word("a dog") and not ends_in_function_word("")


def test_a_scene_reward_needs_a_scene_for_every_training_image():
    with pytest.raises(ValueError, match="--scst-reward Objects: d has no recorded scene for every training image"):
        reward_model(reward="Objects")


# ------------------------------------------------------------------------------------------------------ training


def test_scst_changes_only_the_adapter_of_an_ituning_model(world, ce_run, tmp_path, length_reward):
    from accelerate import Accelerator

    from itune_hf.training.data import get_collator, load_splits, training_pairs
    from itune_hf.training.model import build_training_model
    from itune_hf.vision.inputs import VisualInputs

    config = scst_config(world, ce_run, tmp_path / "scst", scst_reward=length_reward, scst_samples=3,
                         scst_baseline="mean")  # fmt: skip
    built = build_training_model(config)
    model, accelerator = built.model, Accelerator(cpu=True)
    start = load_file(ce_run / "adapter_model.safetensors")
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == len(start) and all(".ituning_modules." in name for name in trained)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rows, _ = load_splits(config)
    visual = VisualInputs.for_model(built.base)
    pairs = training_pairs(config, rows, None, accelerator, visual)
    batch = get_collator(config, pairs, built.processor, None, visual)(pairs.first_items(4))
    objective = SelfCritical.for_run(config, built.processor, rows, pairs.num_images)
    loss, stats = objective.loss(model, model, batch, accelerator)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and changed <= set(trained)
    assert {"reward", "baseline", "bad_endings", "finished"} <= set(stats) and "greedy" not in stats


@pytest.mark.slow  # trains several runs
def test_a_run_resumed_mid_scst_ends_where_the_uninterrupted_run_ends(world, ce_run, tmp_path, length_reward):
    straight = scst_config(world, ce_run, tmp_path / "straight", scst_reward=length_reward, max_steps=4, save_every=2)
    summary = train(straight)
    history = [entry for entry in summary["history"] if "reward" in entry]
    assert len(history) == 4 and {"greedy", "baseline", "bad_endings", "greedy_bad_endings"} <= set(history[0])
    assert any(entry["reward"] != entry["baseline"] for entry in history)  # something to learn from
    cut = scst_config(world, ce_run, tmp_path / "cut", scst_reward=length_reward, max_steps=2, save_every=2)
    train(cut)
    train(scst_config(world, ce_run, tmp_path / "cut", scst_reward=length_reward, max_steps=4, save_every=2,
                      resume=True))  # fmt: skip
    expected, resumed = (load_file(tmp_path / name / "adapter_model.safetensors") for name in ("straight", "cut"))
    assert expected.keys() == resumed.keys() and all(torch.equal(expected[k], resumed[k]) for k in expected)
    assert not all(torch.equal(expected[k], load_file(ce_run / "adapter_model.safetensors")[k]) for k in expected)


@pytest.mark.slow  # trains, with a measured step
def test_itune_train_objective_scst_from_a_tiny_run(world, ce_run, tmp_path, capsys):
    out = tmp_path / "scst"
    status = main([
        "train", "--output-dir", str(out), "--data", str(world), "--preset", "itune-tiny-random", "--batch-size", "4",
        "--eval-split", "none", "--report-to", "none", "--max-steps", "2", "--max-caption-length", "8",
        "--objective", "scst", "--init-model", str(ce_run), "--scst-samples", "2", "--scst-baseline", "mean",
        "--scst-ending-penalty", "0.1", "--log-every", "1", "--time-budget", "600",
    ])  # fmt: skip
    printed = capsys.readouterr()
    assert status == 0, printed.err[-3000:]
    assert "time budget 600s:" in printed.out and "2 of 2 steps" in printed.out  # sized from a measured SCST step
    summary = json.loads(printed.out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["trainable_parameters"] == 4256
    recorded = json.loads((out / "training_config.json").read_text())
    assert recorded["objective"] == "scst" and recorded["scst_samples"] == 2 and recorded["init_model"] == str(ce_run)
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    logged = json.loads((out / "train_summary.json").read_text())["history"]
    assert all({"reward", "baseline", "bad_endings"} <= set(entry) for entry in logged)


@pytest.mark.slow
def test_itune_train_objective_scst_for_xgpt(world, tmp_path, capsys):
    common = ["--data", str(world), "--preset", "xgpt-tiny-random", "--batch-size", "4", "--eval-split", "none",
              "--report-to", "none", "--max-caption-length", "8"]  # fmt: skip
    assert main(["train", "--output-dir", str(tmp_path / "ce"), *common, "--max-steps", "1"]) == 0
    status = main(["train", "--output-dir", str(tmp_path / "scst"), *common, "--max-steps", "2", "--objective",
                   "scst", "--init-model", str(tmp_path / "ce")])  # fmt: skip
    assert status == 0, capsys.readouterr().err[-3000:]
    assert (tmp_path / "scst" / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([], "--objective scst fine-tunes a trained captioner: pass --init-model RUN"),
        (["--init-model", "RUN", "--scst-reward", "CIDEx"], "--scst-reward CIDEx: Unknown metric 'CIDEx'; choose from"),
        (["--init-model", "RUN", "--scst-reward", "SPICE"], "--scst-reward SPICE: SPICE runs a Java tool"),
        (
            ["--init-model", "RUN", "--scst-baseline", "mean"],
            "--scst-baseline mean compares each sample with the other",
        ),
        (["--init-model", "RUN", "--tasks", "ic,imlm"], "--objective scst trains captioning only"),
        (["--init-model", "RUN", "--retrieval", "DS"], "--retrieval DS with --objective scst: SCST samples its"),
    ],
)
def test_bad_scst_options_are_refused_in_one_line_naming_the_option(tmp_path, capsys, options, message):
    status = main(["train", "--output-dir", str(tmp_path / "o"), "--objective", "scst", *options])
    assert status == 2 and message in capsys.readouterr().err


def test_scst_options_without_the_scst_objective_are_refused(tmp_path, capsys):
    assert main(["train", "--output-dir", str(tmp_path / "o"), "--scst-samples", "5"]) == 2
    assert "--scst-samples: options of --objective scst, but the objective is ce" in capsys.readouterr().err


def test_init_model_without_an_adapter_or_for_a_family_that_cannot_start_from_one_is_refused(world, tmp_path, capsys):
    common = ["--data", str(world), "--batch-size", "4", "--eval-split", "none", "--report-to", "none"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "--output-dir", str(tmp_path / "a"), *common, "--preset", "itune-tiny-random",
                 "--init-model", str(empty), "--objective", "scst"]) == 2  # fmt: skip
    assert f"--init-model {empty}: no adapter_config.json there" in capsys.readouterr().err
    assert main(["train", "--output-dir", str(tmp_path / "b"), *common, "--preset", "clipcap-mlp-tiny-random",
                 "--init-model", str(empty)]) == 2  # fmt: skip
    assert "runs cannot start from a trained model (only ituning, xgpt presets)" in capsys.readouterr().err


def test_the_objects_reward_reads_each_caption_against_its_images_scene(world):
    from itune_hf.data import load_captions

    rows = load_captions(str(world))["train"]
    config = SimpleNamespace(
        scst_reward="Objects", scst_count_eos=True, scst_ending_penalty=0.0, max_caption_length=20, data=str(world)
    )
    scst = SelfCritical.for_run(config, None, rows, len(rows))
    assert not scst.end_word  # the world's grammar reads the caption, not n-grams
    rewards, _ = scst.rewards([rows[0]["captions"][0], "nothing named here"], [0, 0], [True, True])
    assert rewards == [1.0, 0.0]


def test_an_image_the_content_word_reward_cannot_grade_gives_no_signal_not_nan():
    from itune_hf.data.scenes import RecordedWords

    config = SimpleNamespace(
        scst_reward="ContentWords", scst_count_eos=True, scst_ending_penalty=0.0, max_caption_length=20, data="clip"
    )
    scenes = [RecordedWords(frozenset({"cat"})), RecordedWords(frozenset({"the"}))]  # the second names no word
    scst = SelfCritical(config, None, [["a cat"], ["a thing"]], scenes)
    rewards, _ = scst.rewards(["a cat", "a cat"], [0, 1], [True, True])
    assert rewards == [1.0, 0.0]
