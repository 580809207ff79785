"""Exact nearest-caption search of a retrieval datastore: a matrix product (`search="exact"`) against faiss's
`IndexFlatIP` (`search="faiss"`), both exact, at several datastore sizes; the ratio sets `FAISS_MIN_ENTRIES`.

    python benchmarks/bench_datastore_search.py --width 1280 --queries 1024 --sizes 5000,50000,200000

Prints one JSON line per size: seconds per search of all the queries (best of 3, index built beforehand) and the
ratio exact / faiss. Needs faiss-cpu (`pip install '.[index]'`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

from itune_hf.vision.datastore import CaptionDatastore


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--sizes", default="5000,50000,200000")
    parser.add_argument("--k", type=int, default=12)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    queries = torch.nn.functional.normalize(torch.randn(args.queries, args.width, generator=generator), dim=-1)
    for size in map(int, args.sizes.split(",")):
        keys = torch.nn.functional.normalize(torch.randn(size, args.width, generator=generator), dim=-1)
        ids = [str(i) for i in range(size)]
        store = CaptionDatastore(keys, ids, [["x"]] * size, ids, search="exact")
        faiss_store = dataclasses.replace(store, search="faiss")
        faiss_store.ranked(queries[:1], 1)  # builds the index
        assert store.ranked(queries[:8], args.k) == faiss_store.ranked(queries[:8], args.k)
        exact = best_of(3, lambda searched=store: searched.ranked(queries, args.k))
        indexed = best_of(3, lambda searched=faiss_store: searched.ranked(queries, args.k))
        row = {"entries": size, "width": args.width, "queries": args.queries, "exact_s": round(exact, 4),
               "faiss_s": round(indexed, 4), "exact_over_faiss": round(exact / indexed, 2),
               "threads": torch.get_num_threads(), "load_1min": round(os.getloadavg()[0], 2)}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
