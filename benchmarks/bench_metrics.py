"""Speed of coco-caption scoring: itune_hf.metrics (pure Python) against pycocoevalcap 1.2 (Java tokenizer).

Scores BLEU-1..4, ROUGE-L and CIDEr-D of a generated COCO-like corpus (default 5,000 images x 5 references,
fixed seed), tokenisation included, several times with each implementation, and reports the median seconds, the
ratio and the largest difference between the two sets of scores (they must be identical).

    python benchmarks/bench_metrics.py                 # 5,000 x 5, 5 runs of ours, 3 of pycocoevalcap, 5 of itune score
    python benchmarks/bench_metrics.py --hard --images 1000

Our runs start cold: the word cache of the tokenizer is cleared before each run. pycocoevalcap's time includes
starting Java for its PTB tokenizer (twice: references, then predictions), as every coco-caption evaluation does.
A third row times `itune score PREDICTIONS.json REFERENCES.json --metrics BLEU,ROUGE_L,CIDEr` end to end as a user
runs it: a subprocess, interpreter start, imports and JSON reading included (the files are written beforehand).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

_start = time.perf_counter()
from itune_hf.metrics import FAST_METRICS, ptb_tokenizer, score_captions_detailed  # noqa: E402
from itune_hf.metrics.synthetic import make_corpus  # noqa: E402

IMPORT_SECONDS = time.perf_counter() - _start


def ours(predictions, references):
    ptb_tokenizer.clear_cache()
    start = time.perf_counter()
    result = score_captions_detailed(predictions, references, metrics=FAST_METRICS)
    return time.perf_counter() - start, result.scores, result.per_image


def pycocoevalcap(predictions, references):
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    start = time.perf_counter()
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in refs] for k, refs in references.items()})
    res = tokenizer.tokenize({k: [{"caption": predictions[k]}] for k in references})
    scores, per_image = {}, {}
    bleu, bleu_images = Bleu(4).compute_score(gts, res, verbose=0)
    for k in range(4):
        scores[f"Bleu_{k + 1}"], per_image[f"Bleu_{k + 1}"] = bleu[k], bleu_images[k]
    scores["ROUGE_L"], per_image["ROUGE_L"] = Rouge().compute_score(gts, res)
    scores["CIDEr"], per_image["CIDEr"] = Cider().compute_score(gts, res)
    return time.perf_counter() - start, scores, per_image


def write_coco_files(predictions, references, directory: Path) -> tuple[Path, Path]:
    """The corpus as `itune score` reads it: COCO results and COCO caption annotations.

    Args:
        predictions: Image id -> generated caption.
        references: Image id -> reference captions.
        directory: Where the two JSON files go.
    """
    pred_path, ref_path = directory / "predictions.json", directory / "captions.json"
    pred_path.write_text(json.dumps([{"image_id": k, "caption": c} for k, c in predictions.items()]))
    annotations = [
        {"image_id": k, "id": len(refs) * n + i, "caption": c}
        for n, (k, refs) in enumerate(references.items())
        for i, c in enumerate(refs)
    ]
    ref_path.write_text(json.dumps({"images": [{"id": k} for k in references], "annotations": annotations}))
    return pred_path, ref_path


def itune_score_command() -> list[str]:
    """The `itune` console script next to this interpreter, else `python -m itune_hf.cli`."""
    script = Path(sys.executable).parent / "itune"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "itune_hf.cli"]


def itune_score(pred_path: Path, ref_path: Path):
    """Time `itune score` in a fresh process (interpreter start included); its corpus scores.

    Args:
        pred_path: COCO results file.
        ref_path: COCO caption annotations file.
    """
    command = [*itune_score_command(), "score", str(pred_path), str(ref_path), "--metrics", "BLEU,ROUGE_L,CIDEr"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"itune score failed: {result.stderr[-2000:]}")
    return seconds, json.loads(result.stdout)


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    except OSError:
        cores = "?"
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except (OSError, IndexError):
        java = "none"
    return {
        "nproc": cores,
        "CPU": cpu,
        "Python": platform.python_version(),
        "numpy": version("numpy"),
        "pycocoevalcap": version("pycocoevalcap"),
        "Java": java,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--refs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hard", action="store_true", help="the tokeniser edge-case corpus instead of COCO-like")
    parser.add_argument("--runs", type=int, default=5, help="runs of ours")
    parser.add_argument("--coco-runs", type=int, default=3, help="runs of pycocoevalcap")
    parser.add_argument("--cli-runs", type=int, default=5, help="runs of `itune score` (a subprocess each)")
    args = parser.parse_args()

    predictions, references = make_corpus(args.images, args.refs, seed=args.seed, hard=args.hard)
    kind = "hard (tokeniser edge cases)" if args.hard else "COCO-like"
    print(f"corpus: {args.images} images x {args.refs} references, {kind}, seed {args.seed}", flush=True)

    our_times, coco_times = [], []
    for run in range(args.runs):
        seconds, our_scores, our_per_image = ours(predictions, references)
        our_times.append(seconds)
        print(f"  itune_hf.metrics run {run + 1}: {seconds:.3f} s", flush=True)
    for run in range(args.coco_runs):
        seconds, coco_scores, coco_per_image = pycocoevalcap(predictions, references)
        coco_times.append(seconds)
        print(f"  pycocoevalcap run {run + 1}: {seconds:.3f} s", flush=True)

    cli_times = []
    with tempfile.TemporaryDirectory() as directory:
        pred_path, ref_path = write_coco_files(predictions, references, Path(directory))
        for run in range(args.cli_runs):
            seconds, cli_scores = itune_score(pred_path, ref_path)
            cli_times.append(seconds)
            print(f"  itune score (subprocess) run {run + 1}: {seconds:.3f} s", flush=True)

    ids = list(references)
    worst_corpus = max(abs(our_scores[name] - coco_scores[name]) for name in coco_scores)
    worst_image = max(
        abs(our_per_image[key][name] - float(coco_per_image[name][index]))
        for name in coco_scores
        for index, key in enumerate(ids)
    )
    worst_cli = max(abs(cli_scores[name] - coco_scores[name]) for name in coco_scores)
    ours_median, coco_median = statistics.median(our_times), statistics.median(coco_times)
    cli_median = statistics.median(cli_times)
    info = machine()
    print()
    print(f"date: {datetime.date.today().isoformat()}")
    for key, value in info.items():
        print(f"{key}: {value}")
    print()
    print("| implementation | corpus | median seconds | runs | speed-up |")
    print("|---|---|---|---|---|")
    print(
        f"| pycocoevalcap {info['pycocoevalcap']} (Java PTB tokenizer) | {args.images} x {args.refs} | "
        f"{coco_median:.3f} | {args.coco_runs} | 1.0x |"
    )
    print(
        f"| itune_hf.metrics (pure Python) | {args.images} x {args.refs} | {ours_median:.3f} | {args.runs} | "
        f"{coco_median / ours_median:.1f}x |"
    )
    print(
        f"| itune score (subprocess, interpreter start included) | {args.images} x {args.refs} | {cli_median:.3f} | "
        f"{args.cli_runs} | {coco_median / cli_median:.1f}x |"
    )
    print()
    print("| metric | pycocoevalcap | itune_hf.metrics |")
    print("|---|---|---|")
    for name in coco_scores:
        print(f"| {name} | {coco_scores[name]:.12f} | {our_scores[name]:.12f} |")
    print()
    print(f"one-time import of itune_hf.metrics (compiles the lexer's regular expressions): {IMPORT_SECONDS:.2f} s")
    print(
        f"largest difference: corpus scores {worst_corpus:.1e}, per-image scores {worst_image:.1e}, "
        f"itune score's corpus scores {worst_cli:.1e}"
    )
    identical = max(worst_corpus, worst_image, worst_cli) <= 1e-9
    print("scores identical (<= 1e-9):", "yes" if identical else "NO")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
