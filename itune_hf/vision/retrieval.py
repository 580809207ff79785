"""The classic captioning baseline: nearest-neighbour caption retrieval over the frozen vision tower's features.

Each test image gets the caption of the training image whose pooled tower features are most similar (cosine), read
from the same feature cache the captioners train on (`itune cache-features`), so a trained captioner and this
baseline see exactly the same image representation. Pooling: the mean of the tower's tokens (a convolutional tower's
grid cells). No training; what a trained captioner must beat to show that it does more than look up its nearest
training image.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from ..models._shared.backbones import as_vision_tokens
from .feature_cache import FeatureCache


def pooled_features(cache: FeatureCache, image_ids: Sequence[str], batch_size: int = 256) -> torch.Tensor:
    """`(N, width)` L2-normalised means of the cached tower states of `image_ids`.

    Args:
        cache: The feature cache holding every image.
        image_ids: The images, in order.
        batch_size: Images read at a time.
    """
    pooled = [
        pool_states(cache.get(list(image_ids[start : start + batch_size]), dtype=torch.float32))
        for start in range(0, len(image_ids), batch_size)
    ]
    return torch.cat(pooled)


def pool_states(states: torch.Tensor) -> torch.Tensor:
    """`(N, width)` L2-normalised means of a batch of tower states: what retrieval compares, for cached states and
    for the states a model computes from pixels alike.

    Args:
        states: `(N, tokens, width)` vision tokens, or a convolutional tower's `(N, channels, height, width)` map.
    """
    return torch.nn.functional.normalize(as_vision_tokens(states.float()).mean(dim=1), dim=-1)


def nearest_neighbour_captions(
    cache: FeatureCache,
    train: Mapping[Hashable, Sequence[str]],
    test_ids: Sequence[Hashable],
    batch_size: int = 256,
) -> dict[Hashable, str]:
    """Each test image's caption: the first reference of the most similar training image (ties: the earlier one).

    Args:
        cache: The feature cache holding the training and test images.
        train: Training image id -> its references.
        test_ids: The images to caption.
        batch_size: Test images compared at a time.

    Raises:
        ValueError: `train` is empty.
    """
    if not train:
        raise ValueError("retrieval needs training images to take captions from")
    train_ids = list(train)
    train_features = pooled_features(cache, [str(i) for i in train_ids])
    captions = {}
    for start in range(0, len(test_ids), batch_size):
        batch = list(test_ids[start : start + batch_size])
        similarity = pooled_features(cache, [str(i) for i in batch]) @ train_features.T
        for image_id, nearest in zip(batch, similarity.argmax(dim=1).tolist()):
            captions[image_id] = train[train_ids[nearest]][0]
    return captions


__all__ = ["nearest_neighbour_captions", "pool_states", "pooled_features"]
