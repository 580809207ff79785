"""`--group-by-length`: batches of similar caption length (less padding), in an order that depends only on (seed,
epoch), with the time budget measured on a typical grouped batch."""

from __future__ import annotations

import json
import random

import pytest
import torch

from itune_hf.cli import main
from itune_hf.data import make_synthetic
from itune_hf.training import EpochPermutation, LengthGroupedPermutation
from itune_hf.training.data import caption_lengths

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]


def padded_tokens(batches, lengths) -> int:
    return sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)


def cut(order, batch_size):
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]


def test_every_pair_once_whole_batches_of_similar_length_and_a_pure_function_of_seed_and_epoch():
    rng = random.Random(0)
    lengths = [rng.randint(4, 30) for _ in range(1003)]  # 1003 = 31 batches of 32 + 11: one short batch
    sampler = LengthGroupedPermutation(lengths, batch_size=32, seed=5, megabatch=8)
    order = list(sampler)
    assert sorted(order) == list(range(1003))
    batches = cut(order, 32)  # what a DataLoader of batch size 32 makes of the order
    assert batches == sampler.batches() and len(batches[-1]) == 11  # the short batch is last
    spans = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches[:-1]]
    assert max(spans) <= 8  # 256 pairs per sorted mega-batch over lengths 4..30: neighbours in length
    random_order = list(EpochPermutation(1003, seed=5))
    assert padded_tokens(batches, lengths) < 0.75 * padded_tokens(cut(random_order, 32), lengths)

    again = LengthGroupedPermutation(lengths, batch_size=32, seed=5, megabatch=8)
    assert list(again) == order  # a resumed run (a new sampler) sees the same order
    again.set_epoch(1)
    assert list(again) != order and sorted(again) == list(range(1003))
    assert list(LengthGroupedPermutation(lengths, batch_size=32, seed=6, megabatch=8)) != order


def test_the_typical_batch_has_the_mean_padded_length():
    lengths = [4] * 300 + [12] * 100 + [20] * 600
    sampler = LengthGroupedPermutation(lengths, batch_size=10, seed=0)
    typical = sampler.typical_batch()
    mean = padded_tokens(sampler.batches(), lengths) / len(lengths)
    assert len(typical) == 10 and 14 < mean < 16  # 0.3 * 4 + 0.1 * 12 + 0.6 * 20 = 14.4, a little padding more
    assert {lengths[i] for i in typical} == {12}  # the length nearest the mean, not the most common one (20)


def test_lengths_are_counted_in_the_processors_tokens():
    from itune_hf import build_processor

    processor = build_processor("itune-tiny-random")
    captions = ["A red circle.", "Two red circles above a blue square on a gray background."]
    expected = [len(processor.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in captions]
    assert caption_lengths(processor, captions) == expected and expected[0] < expected[1]
    assert caption_lengths(object(), captions) == [len(c) for c in captions]  # no tokenizer: characters


@pytest.mark.slow
def test_itune_train_groups_by_length_and_sizes_its_budget_on_a_grouped_batch(tmp_path, capsys):
    make_synthetic(tmp_path / "data", num_images=40, seed=3, image_size=32)
    out = tmp_path / "run"
    common = ["--data", str(tmp_path / "data" / "dataset.json"), *TINY, "--eval-split", "none", "--group-by-length"]
    assert main(["train", "--output-dir", str(out), *common, "--max-steps", "3"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["captions_seen"] == 12
    assert json.loads((out / "training_config.json").read_text())["group_by_length"] is True

    budget = ["train", "--output-dir", str(tmp_path / "budget"), *common, "--max-steps", "100000", "--time-budget", "2"]
    assert main(budget) == 0
    assert "s per step measured" in capsys.readouterr().out


def test_streamed_data_refuses_grouping_naming_the_flag(tmp_path, capsys):
    assert (
        main(["make-synthetic", "--output-dir", str(tmp_path / "w"), "--num-images", "12", "--image-size", "32"]) == 0
    )
    shards = tmp_path / "shards"
    assert main(["make-shards", "--data", str(tmp_path / "w"), "--output-dir", str(shards), "--shard-size", "5"]) == 0
    capsys.readouterr()
    argv = ["train", "--data", str(shards), *TINY, "--output-dir", str(tmp_path / "o"), "--group-by-length"]
    assert main([*argv, "--max-steps", "1", "--eval-split", "none"]) == 2
    err = capsys.readouterr().err
    assert "--group-by-length" in err and "streamed" in err


def test_grouped_batches_through_a_dataloader_are_the_samplers():
    lengths = [3, 9, 4, 8, 5, 7, 6, 2, 1, 10]
    sampler = LengthGroupedPermutation(lengths, batch_size=3, seed=1)
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=3, sampler=sampler)
    assert [batch.tolist() for batch in loader] == sampler.batches()
