"""Caption datasets as `datasets.Dataset`: Karpathy splits (COCO, Flickr30k, Flickr8k), NoCaps, Visual Genome,
WebDataset tar shards (streamed), Hugging Face datasets, the embedded synthetic caption world, a tiny set of real
photos and the clip-art corpus of Debian's openclipart-svg package.

Every loader returns the same columns (`image_id`, `image_path`, `captions`, `split`, plus `domain` for NoCaps,
`image` for embedded Hugging Face images, and `boxes`, normalised `[x1, y1, x2, y2]`: object boxes for the synthetic
world and for Karpathy/COCO-style files loaded with `instances=`, each caption's region for Visual Genome, see
`boxes.py`); `load_captions` picks the loader from the input and is what every `itune` command uses
(`add_data_arguments` adds its options to a command). `RegionFeatures` reads precomputed (bottom-up attention)
region features for XGPT.

Names are imported lazily, so `import itune_hf.data` (and `itune --help`) stays fast.
"""

from __future__ import annotations

from ..utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    # _common
    "CAPTION_COLUMNS": "_common",
    "DataError": "_common",
    "DataFormatError": "_common",
    "EmptyCaptionsWarning": "_common",
    "ImageReport": "_common",
    "RepeatedImagesWarning": "_common",
    "SplitSizeWarning": "_common",
    "UnusableImagesError": "_common",
    "UnusableImagesWarning": "_common",
    "UnreadableTextWarning": "_common",
    # loaders
    "load_karpathy": "karpathy",
    "KARPATHY_SPLIT_SIZES": "karpathy",
    "load_nocaps": "coco_style",
    "load_coco_captions": "coco_style",
    "NOCAPS_SIZES": "coco_style",
    "load_visual_genome": "visual_genome",
    "VISUAL_GENOME_IMAGES": "visual_genome",
    "CocoOverlapWarning": "visual_genome",
    "load_webdataset": "webdataset",
    "write_shards": "webdataset",
    "BadShardWarning": "webdataset",
    "load_hf_captions": "hf",
    "read_coco_results": "coco_results",
    "read_coco_references": "coco_results",
    "load_captions": "loading",
    "builtin_dataset": "loading",
    "data_cache_dir": "loading",
    "BUILTIN_DATASETS": "loading",
    # the annotation formats load_captions detects
    "DataFormat": "formats",
    "detect_format": "formats",
    "list_formats": "formats",
    "register_format": "formats",
    "unregister_format": "formats",
    "verify_images": "verify",
    "open_example_image": "verify",
    "add_data_arguments": "args",
    "load_data_from_args": "args",
    # object boxes and region features (XGPT's region inputs)
    "WHOLE_IMAGE_BOX": "boxes",
    "normalise_xywh": "boxes",
    "read_instance_boxes": "boxes",
    "RegionFeatures": "regions",
    # generated datasets
    "make_synthetic": "synthetic",
    "CaptionNoise": "synthetic",
    "make_photos": "photos",
    "list_photos": "photos",
    "PhotoSkippedWarning": "photos",
    "make_clipart": "clipart",
    "locate_openclipart": "clipart",
    "ClipartSkippedWarning": "clipart",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
