"""Code every model family shares, written once here.

Remote code (a checkpoint loaded with `trust_remote_code=True` where itune_hf is not installed) carries the files
its model file imports from beside it, so each family folder holds a generated copy of the files it uses, under a
"Generated from" header: `make fix-copies` (tools/fix_copies.py) writes them, and `tests/test_shared_copies.py`
fails when one differs from its source. The package's own modules (training, pipelines, commands, ...) import from
here, never from a family folder. Files here import only the standard library, numpy, PIL, torch and transformers.
"""
