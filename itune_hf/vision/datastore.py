"""A datastore of captions keyed by the frozen vision tower's pooled features, for retrieval-augmented captioning.

Retrieval augmentation (SmallCap, Ramos et al., 2023) gives the captioner, besides the image, the captions of the `k`
most similar images of a datastore as a text prompt; the LM learns to use them where they fit the image. The tower
and the LM stay frozen, so swapping the datastore (another domain's captions) changes what the model knows without
training.

- Keys: the L2-normalised mean of an image's cached tower states (`retrieval.pooled_features`: the same
  representation as the nearest-neighbour baseline), in `keys.safetensors`; the entries (image id, captions, near-
  duplicate group) in `datastore.json`.
- Search: exact top-k by cosine similarity (a matrix product; a few thousand entries take milliseconds), or faiss's
  exact inner-product index where it is installed (`pip install 'itune_hf[index]'`) and the datastore is large
  (`CaptionDatastore.search`): the same entries, with memory bounded (it searches in blocks).
- In training an image never retrieves itself or an image of its near-duplicate group (a `group` field of the data,
  e.g. `itune make-clipart`'s), or the model learns to copy an answer that test images never get.
- The prompt: `Similar images: <caption 1>; <caption 2>; ... . This image:` (each retrieved image's first caption),
  which the caption continues (the processor's prompted captioning: the prompt's tokens carry no loss).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: The files of a saved datastore.
KEYS_FILE, ENTRIES_FILE = "keys.safetensors", "datastore.json"
#: The folder of a trained retrieval-augmented model that holds its datastore.
DATASTORE_DIR = "datastore"
#: The format version of a saved datastore.
DATASTORE_VERSION = 1
#: How many captions the prompt holds unless told otherwise (SmallCap's k).
DEFAULT_K = 4
PROMPT_START, PROMPT_END = "Similar images:", "This image:"
#: How `CaptionDatastore.search` finds the nearest entries.
SEARCHES = ("auto", "exact", "faiss")
#: From this many entries, "auto" searches with faiss where it is installed: as exact and barely faster (1.1-1.2x,
#: benchmarks/records/datastore-search.json), but in blocks, where the matrix product holds queries x entries scores
#: (200 MB for 1,024 queries at 50,000 entries).
FAISS_MIN_ENTRIES = 50_000
#: The fingerprint fields (`itune_hf.vision.feature_cache.vision_fingerprint`) that say which tower made a
#: datastore's keys (the storage dtype aside: it keys the same images alike).
TOWER_FIELDS = ("vision_config_sha256", "vision_weights_sha256", "image_processor_sha256")


class DatastoreError(ValueError):
    """A datastore that cannot be used as given; the message names the folder and the problem."""


def retrieval_prompt(captions: Sequence[str]) -> str:
    """The prompt made of retrieved captions: `Similar images: a; b; c. This image:`.

    Args:
        captions: The retrieved captions, most similar first.
    """
    listed = "; ".join(caption.strip().rstrip(".").strip() for caption in captions if caption.strip())
    return f"{PROMPT_START} {listed}. {PROMPT_END}"


@dataclass
class CaptionDatastore:
    """Captions keyed by pooled tower features.

    Args:
        keys: `(N, width)` L2-normalised pooled features, one row per entry.
        image_ids: The entries' image ids.
        captions: Each entry's captions (its first is the one a prompt quotes).
        groups: Each entry's near-duplicate group (its own image id when the data records none).
        tower: What made the keys (the feature cache and its fingerprint), recorded; their width is checked on use.
        k: The captions a prompt quotes (the number the model was trained with).
        search: How the nearest entries are found, exactly either way: "exact" (a matrix product), "faiss" (faiss's
            `IndexFlatIP`, `pip install 'itune_hf[index]'`: the same entries, searched in blocks), or "auto" (faiss
            where it is installed and the datastore holds at least `FAISS_MIN_ENTRIES` entries; else the product).
    """

    keys: torch.Tensor
    image_ids: list[str]
    captions: list[list[str]]
    groups: list[str]
    tower: dict[str, Any] = field(default_factory=dict)
    k: int = DEFAULT_K
    search: str = "auto"
    _index: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        count = len(self.image_ids)
        if self.keys.ndim != 2 or self.keys.shape[0] != count or len(self.captions) != count:
            raise DatastoreError(
                f"a datastore needs one key row and one caption list per image: {tuple(self.keys.shape)} keys, "
                f"{count} image ids, {len(self.captions)} caption lists"
            )
        if any(not captions for captions in self.captions):
            raise DatastoreError("every datastore entry needs at least one caption")

    def __len__(self) -> int:
        return len(self.image_ids)

    @classmethod
    def from_cache(
        cls,
        cache: Any,
        image_ids: Sequence[str],
        captions: Sequence[Sequence[str]],
        groups: Sequence[str | None] | None = None,
        tower: Mapping[str, Any] | None = None,
        k: int = DEFAULT_K,
    ) -> CaptionDatastore:
        """Build a datastore from the cached tower states of `image_ids`.

        Args:
            cache: A `FeatureCache` holding every image.
            image_ids: The images.
            captions: Their captions.
            groups: Their near-duplicate groups (None, or a None entry: the image is its own group).
            tower: What made the cache (recorded; e.g. the feature cache's fingerprint).
            k: The captions a prompt quotes.
        """
        from .retrieval import pooled_features

        ids = [str(i) for i in image_ids]
        group_list = [str(g) if g else i for g, i in zip(groups or [None] * len(ids), ids)]
        keys = pooled_features(cache, ids)
        return cls(keys, ids, [list(c) for c in captions], group_list, dict(tower or {}), k)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `keys.safetensors` and `datastore.json` into `directory` (created); returns it."""
        from safetensors.torch import save_file

        from ..utils.files import atomic_write_json

        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"keys": self.keys.contiguous().float()}, str(folder / KEYS_FILE))
        entries = [
            {"image_id": i, "captions": c, "group": g} for i, c, g in zip(self.image_ids, self.captions, self.groups)
        ]
        atomic_write_json(
            folder / ENTRIES_FILE,
            {"version": DATASTORE_VERSION, "k": self.k, "tower": self.tower, "entries": entries},
            indent=None,
        )
        return folder

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CaptionDatastore:
        """Read a datastore written by `save`.

        Raises:
            DatastoreError: naming the folder and the missing or malformed file.
        """
        from safetensors.torch import load_file

        folder = Path(directory)
        for name in (KEYS_FILE, ENTRIES_FILE):
            if not (folder / name).is_file():
                raise DatastoreError(
                    f"{folder}: no {name}, so not a caption datastore (itune train --retrieval writes one into the "
                    "model's folder, under datastore/)"
                )
        try:
            data = json.loads((folder / ENTRIES_FILE).read_text(encoding="utf-8"))
            entries = data["entries"]
            keys = load_file(str(folder / KEYS_FILE))["keys"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DatastoreError(f"{folder}: a damaged datastore ({type(error).__name__}: {error})") from None
        if data.get("version") != DATASTORE_VERSION:
            raise DatastoreError(f"{folder}: datastore version {data.get('version')}; this package reads version 1")
        return cls(
            keys,
            [e["image_id"] for e in entries],
            [e["captions"] for e in entries],
            [e.get("group") or e["image_id"] for e in entries],
            data.get("tower") or {},
            int(data.get("k", DEFAULT_K)),
        )

    def nearest(self, queries: torch.Tensor, k: int, exclude: Sequence[set[str]] | None = None) -> list[list[int]]:
        """The `k` most similar entries of each query (cosine, exact), most similar first.

        Args:
            queries: `(M, width)` L2-normalised pooled features.
            k: Entries per query.
            exclude: Per query, image ids and groups it may not retrieve (its own, in training).
        """
        if queries.shape[-1] != self.keys.shape[-1]:
            raise DatastoreError(
                f"the datastore's keys are {self.keys.shape[-1]} wide but the queries {queries.shape[-1]}: it was "
                f"built with another vision tower ({self.tower or 'unrecorded'})"
            )
        extra = 0 if exclude is None else max((len(e) for e in exclude), default=0)
        # enough candidates that k remain once a query's own group is left out (a group holds few images)
        depth = min(len(self), k + max(extra, 1) * 8)
        order = self.ranked(queries, depth)
        chosen = []
        for row, candidates in enumerate(order):
            banned = exclude[row] if exclude is not None else set()
            kept = [j for j in candidates if self.image_ids[j] not in banned and self.groups[j] not in banned]
            if len(kept) < k:  # a large group: look at every entry
                (full,) = self.ranked(queries[row : row + 1], len(self))
                kept = [j for j in full if self.image_ids[j] not in banned and self.groups[j] not in banned]
            chosen.append(kept[:k])
        return chosen

    def ranked(self, queries: torch.Tensor, depth: int) -> list[list[int]]:
        """The `depth` most similar entries of each query, most similar first, by an exact inner-product search:
        faiss's (`IndexFlatIP`) where `search` asks for it or, at "auto", where faiss is installed and the datastore
        holds at least `FAISS_MIN_ENTRIES` entries; else a matrix product.

        Args:
            queries: `(M, width)` L2-normalised pooled features.
            depth: Entries per query.
        """
        index = self._faiss_index()
        if index is not None:
            _, found = index.search(queries.float().contiguous().numpy(), depth)
            return found.tolist()
        return (queries.float() @ self.keys.float().T).topk(depth, dim=-1).indices.tolist()

    def _faiss_index(self):
        """The faiss index over the keys (built once), or None where the search is the matrix product."""
        if self.search not in SEARCHES:
            raise DatastoreError(f"search={self.search!r}: choose one of {', '.join(SEARCHES)}")
        if self.search == "exact" or (self.search == "auto" and len(self) < FAISS_MIN_ENTRIES):
            return None
        if self._index is None:
            try:
                import faiss
            except ImportError:
                if self.search == "faiss":
                    raise DatastoreError(
                        "search='faiss' needs the faiss library: pip install 'itune_hf[index]' (faiss-cpu)"
                    ) from None
                self._index = False  # "auto" without faiss: the matrix product, without trying again
                return None
            self._index = faiss.IndexFlatIP(self.keys.shape[-1])
            self._index.add(self.keys.float().contiguous().numpy())
        return self._index or None

    def check_tower(self, fingerprint: Mapping[str, Any], what: str) -> None:
        """Refuse states of another tower than the one that made the keys, by the fingerprint fields both record
        (`TOWER_FIELDS`; a datastore or cache that records none is checked on the keys' width only).

        Args:
            fingerprint: The fingerprint of what made the queries' states (a `FeatureCache`'s).
            what: Where the states come from, for the message.

        Raises:
            DatastoreError: naming the fields that differ.
        """
        recorded = {name: self.tower.get(name) for name in TOWER_FIELDS if self.tower.get(name)}
        differing = [name for name, value in recorded.items() if fingerprint.get(name) not in (None, value)]
        if differing:
            raise DatastoreError(
                f"the datastore's keys were made by another vision tower than {what} ({', '.join(differing)} "
                "differ): retrieving with them would prompt each image with unrelated captions; build the datastore "
                "again from a feature cache of this model's tower (itune make-datastore)"
            )

    def prompts(
        self,
        cache: Any,
        image_ids: Sequence[str],
        k: int | None = None,
        groups: Sequence[str | None] | None = None,
        batch_size: int = 1024,
    ) -> dict[str, str]:
        """Each image's retrieval prompt: the captions of its `k` nearest entries, never itself or its group.

        Args:
            cache: The `FeatureCache` holding the images' tower states (made by the same tower as the keys).
            image_ids: The images to prompt.
            k: Captions per prompt (default: the datastore's `k`).
            groups: The images' near-duplicate groups (None: each its own).
            batch_size: Queries searched at a time.
        """
        from .retrieval import pooled_features

        self.check_tower(getattr(cache, "fingerprint", {}), f"the feature cache {getattr(cache, 'directory', '')}")
        ids, k = [str(i) for i in image_ids], k or self.k
        own = [{i, str(g)} if g else {i} for i, g in zip(ids, groups or [None] * len(ids))]
        prompts: dict[str, str] = {}
        for start in range(0, len(ids), batch_size):
            chunk = ids[start : start + batch_size]
            neighbours = self.nearest(pooled_features(cache, chunk), k, own[start : start + batch_size])
            for image_id, entries in zip(chunk, neighbours):
                prompts[image_id] = retrieval_prompt([self.captions[j][0] for j in entries])
        return prompts

    def prompts_for_states(self, states: torch.Tensor, k: int | None = None) -> list[str]:
        """The retrieval prompt of each image of a batch, from the tower states a model computed of it (captioning
        new images: `itune caption --datastore`); nothing is left out (these images are not in the datastore).

        Args:
            states: `(N, tokens, width)` vision states (or a convolutional tower's feature map).
            k: Captions per prompt (default: the datastore's `k`).
        """
        from .retrieval import pool_states

        neighbours = self.nearest(pool_states(states), k or self.k)
        return [retrieval_prompt([self.captions[j][0] for j in entries]) for entries in neighbours]

    def prompts_for_pixels(self, model: Any, pixel_values: torch.Tensor) -> list[str]:
        """The retrieval prompt of each image of a batch, from the states `model`'s tower computes of its pixels
        (`itune caption`, the pipeline: images without a feature cache).

        Args:
            model: The captioner (or a PEFT model wrapping one) with `encode_images`.
            pixel_values: `(N, 3, H, W)` images as its processor makes them.
        """
        import torch

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        with torch.no_grad():
            states = base.encode_images(pixel_values.to(next(base.parameters()).device)).last_hidden_state
        return self.prompts_for_states(states.cpu())


def model_datastore(
    model: Any, folder: str | os.PathLike | CaptionDatastore | None, own: str | os.PathLike | None
) -> CaptionDatastore | None:
    """The datastore a captioner retrieves from: `folder` (another domain's, swapped in), else its own (`own`, the
    `DATASTORE_DIR` of its checkpoint) where it has one; None for neither (a model trained without retrieval). A
    swapped-in datastore's prompts quote as many captions as the model was trained with (its own datastore's `k`).

    Args:
        model: The captioner (its family must read retrieved captions: `ModelFamily.retrieval_prompts`).
        folder: A datastore folder or a loaded `CaptionDatastore`, or None.
        own: The model's own datastore folder (it may not exist), or None.

    Raises:
        DatastoreError: a family that reads no prompt, or a folder that is no datastore.
    """
    import dataclasses

    from ..models import family_of

    own_folder = Path(own) if own is not None and Path(own).is_dir() else None
    if folder is None and own_folder is None:
        return None
    family = family_of(model)
    if not family.retrieval_prompts:
        raise DatastoreError(
            f"a datastore gives I-Tuning's LM the retrieved captions as its prompt; {family.title} models read none "
            "(drop the datastore)"
        )
    if folder is None:
        return CaptionDatastore.load(own_folder)
    store = folder if isinstance(folder, CaptionDatastore) else CaptionDatastore.load(folder)
    if own_folder is not None:
        trained_k = int(json.loads((own_folder / ENTRIES_FILE).read_text(encoding="utf-8")).get("k", store.k))
        store = dataclasses.replace(store, k=trained_k)
    return store


def prompt_token_budget(processor: Any, prompts: Mapping[str, str]) -> int:
    """The most tokens any of `prompts` takes (what a training sequence needs beyond its caption).

    Args:
        processor: The captioner's processor (its tokenizer counts).
        prompts: Image id -> prompt.
    """
    tokenizer = processor.tokenizer
    return max((len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts.values()), default=0)


__all__ = [
    "DATASTORE_DIR",
    "DEFAULT_K",
    "FAISS_MIN_ENTRIES",
    "SEARCHES",
    "CaptionDatastore",
    "DatastoreError",
    "model_datastore",
    "prompt_token_budget",
    "retrieval_prompt",
]
