"""Nearest-neighbour caption retrieval over the cached tower features: each image gets the caption of its most
similar training image, read from the same feature cache the captioners train on."""

from __future__ import annotations

import pytest
import torch

from itune_hf.vision.retrieval import nearest_neighbour_captions, pooled_features

from conftest import cached_world


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    return cached_world(tmp_path_factory, "retrieval")


def test_an_image_in_the_training_set_retrieves_its_own_caption(cached):
    splits, cache = cached
    train = dict(zip(splits["train"]["image_id"], map(list, splits["train"]["captions"])))
    some = list(train)[:5]
    assert nearest_neighbour_captions(cache, train, some) == {i: train[i][0] for i in some}


def test_a_test_image_gets_the_caption_of_its_most_similar_training_image(cached):
    splits, cache = cached
    train = dict(zip(splits["train"]["image_id"], map(list, splits["train"]["captions"])))
    test_ids = list(splits["test"]["image_id"])
    captions = nearest_neighbour_captions(cache, train, test_ids)
    features = pooled_features(cache, list(train))
    for image_id in test_ids:
        similarity = pooled_features(cache, [image_id]) @ features.T
        assert captions[image_id] == train[list(train)[int(similarity.argmax())]][0]
    assert torch.allclose(features.norm(dim=-1), torch.ones(len(train)))
    with pytest.raises(ValueError, match="needs training images"):
        nearest_neighbour_captions(cache, {}, test_ids)
