"""The caption datastore of retrieval augmentation (`itune_hf.vision.datastore`): exact top-k by cosine over pooled
tower features, never an image's own near-duplicate group, saved and loaded as two files; and the prompt it makes."""

from __future__ import annotations

import pytest
import torch

from itune_hf.presets import build_processor
from itune_hf.vision.datastore import CaptionDatastore, DatastoreError, prompt_token_budget, retrieval_prompt
from itune_hf.vision.retrieval import pooled_features

from conftest import cached_world


def store_of(vectors: list[list[float]], groups: list[str] | None = None) -> CaptionDatastore:
    keys = torch.nn.functional.normalize(torch.tensor(vectors, dtype=torch.float32), dim=-1)
    ids = [f"i{n}" for n in range(len(vectors))]
    return CaptionDatastore(keys, ids, [[f"caption of {i}.", "another"] for i in ids], groups or ids)


def test_the_prompt_quotes_each_caption_once_without_its_full_stop():
    prompt = retrieval_prompt(["A red circle.", " a blue star ", ""])
    assert prompt == "Similar images: A red circle; a blue star. This image:"


def test_nearest_is_exact_cosine_and_leaves_out_an_images_own_group():
    store = store_of([[1, 0], [0.9, 0.1], [0, 1], [0.7, 0.7]], groups=["a", "a", "b", "c"])
    query = torch.nn.functional.normalize(torch.tensor([[1.0, 0.05]]), dim=-1)
    assert store.nearest(query, 2) == [[0, 1]]
    assert store.nearest(query, 2, exclude=[{"i0"}]) == [[1, 3]]  # itself left out
    assert store.nearest(query, 2, exclude=[{"i0", "a"}]) == [[3, 2]]  # and its near-duplicate group
    with pytest.raises(DatastoreError, match="keys are 2 wide but the queries 3"):
        store.nearest(torch.ones(1, 3), 1)


def test_faiss_finds_the_entries_the_matrix_product_finds():
    """`search="faiss"` (an index library, where installed) is exact too: the same entries in the same order, own
    groups left out; "auto" keeps the product for small datastores."""
    pytest.importorskip("faiss")
    import dataclasses

    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(300, 16, generator=generator), dim=-1)
    queries = torch.nn.functional.normalize(torch.randn(40, 16, generator=generator), dim=-1)
    ids = [f"i{n}" for n in range(300)]
    exact = CaptionDatastore(keys, ids, [[f"c{n}"] for n in range(300)], [f"g{n // 3}" for n in range(300)])
    exact = dataclasses.replace(exact, search="exact")
    indexed = dataclasses.replace(exact, search="faiss")
    banned = [{f"i{3 * q}", f"g{q}"} for q in range(40)]
    assert indexed.nearest(queries, 5) == exact.nearest(queries, 5)
    assert indexed.nearest(queries, 5, exclude=banned) == exact.nearest(queries, 5, exclude=banned)
    assert indexed._index is not None and dataclasses.replace(exact, search="auto")._faiss_index() is None


def test_without_faiss_the_index_search_names_the_install_and_a_family_without_prompts_is_refused(monkeypatch):
    import dataclasses

    from itune_hf.presets import build_model
    from itune_hf.vision.datastore import model_datastore

    store = store_of([[1, 0], [0, 1]], groups=["a", "b"])
    query = torch.tensor([[1.0, 0.0]])
    assert store.nearest(query, 1) == dataclasses.replace(store, search="exact").nearest(query, 1) == [[0]]
    monkeypatch.setitem(__import__("sys").modules, "faiss", None)  # not installed
    with pytest.raises(DatastoreError, match=r"pip install 'itune_hf\[index\]'"):
        dataclasses.replace(store, search="faiss").nearest(query, 1)
    assert dataclasses.replace(store, search="auto").nearest(query, 1) == [[0]]
    with pytest.raises(DatastoreError, match="search='nope': choose one of auto, exact, faiss"):
        dataclasses.replace(store, search="nope").nearest(query, 1)
    with pytest.raises(DatastoreError, match="XGPT models read none"):
        model_datastore(build_model("xgpt-tiny-random"), store, None)
    assert model_datastore(build_model("xgpt-tiny-random"), None, None) is None  # nothing to retrieve from


def test_a_datastore_saves_and_loads_and_a_folder_without_one_is_named(tmp_path):
    store = store_of([[1, 0], [0, 1], [1, 1]], groups=["g", "g", "h"])
    store.k = 2
    loaded = CaptionDatastore.load(store.save(tmp_path / "ds"))
    assert torch.equal(loaded.keys, store.keys) and loaded.image_ids == store.image_ids
    assert (loaded.captions, loaded.groups, loaded.k) == (store.captions, store.groups, 2)
    with pytest.raises(DatastoreError, match=r"no keys.safetensors, so not a caption datastore"):
        CaptionDatastore.load(tmp_path)
    with pytest.raises(DatastoreError, match="one key row and one caption list per image"):
        CaptionDatastore(store.keys, ["only one"], [["x"]], ["only one"])


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    return cached_world(tmp_path_factory, "datastore")


def test_each_training_image_is_prompted_with_its_nearest_other_images_captions(cached):
    splits, cache = cached
    train = splits["train"]
    ids = list(train["image_id"])
    store = CaptionDatastore.from_cache(cache, ids, train["captions"], k=3)
    prompts = store.prompts(cache, ids)
    features = pooled_features(cache, ids)
    for row, image_id in enumerate(ids):
        similarity = features[row] @ features.T
        similarity[row] = -2  # never itself
        nearest = similarity.topk(3).indices.tolist()
        assert prompts[image_id] == retrieval_prompt([train["captions"][j][0] for j in nearest])
    assert prompt_token_budget(build_processor("itune-tiny-random"), prompts) > 10
