"""What every layer of the package uses and nothing of the package's own: errors aside (`itune_hf.errors`), these
modules import only the standard library and each other.

* `files.py`: atomic writes of every state file; `reading()`, which names a damaged file the user gave.
* `output_dirs.py`: the output directory a command owns (checked before work, locked, claimed).
* `numbers.py`: the kinds of numeric option, and the NaN/infinity checks where values enter.
* `runtime.py`: what this hardware does natively (bf16), threads and the allocator.
* `versions.py`: the package's version and the tested dependency ranges.
* `lazy.py`: packages whose names load on first use.
* `text.py`: text for messages (a few examples of a long list).
"""
