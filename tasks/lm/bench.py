"""Memory of the LM data path, measured (issue 33: "tokenising a corpus larger than RAM never
holds it in RAM, and training on a 10 GB token file runs at constant RSS").

    python -m tasks.lm.bench [--corpus-mb 1024] [--budget-mb 256] [--token-gb 10]
                             [--steps 2000] [--tokenizer bytes] [--dir DIR] [--keep]
    python -m tasks.lm.bench --speed bytes,char,bpe [--source stdlib] [--bpe-vocab 4096]

1. Tokenise: writes a generated corpus of ``--corpus-mb`` MB (text files of random words,
   written in blocks, so making it holds nothing either) and tokenises it through the
   task's own path (tasks/lm: sources -> split -> tokenizer -> token files), sampling the
   process' RSS every 0.2 s in a thread. Prints the peak RSS over the start and whether
   the growth stayed under ``--budget-mb``, a budget set below the corpus' size.
2. Sample: creates a sparse token file of ``--token-gb`` GB (no disk used: a hole reads as
   zeros) and draws ``--steps`` batches of random windows (64 x 1025 tokens) from it, as
   training does (TokenFile.windows: pread), printing RSS as it goes; then the same through
   a numpy memmap for comparison (touched pages of a mapping count in RSS).

3. ``--speed``: tokenisation speed (MB/s) of a source, per tokenizer, each in a fresh cache,
   the fit (char vocabulary, BPE training) timed apart.

A benchmark prints numbers; nothing here is asserted by the test suite.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    """User + system CPU seconds of this process, all its threads (the Rust tokenizer's too)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class PeakRSS:
    """The largest RSS seen by a sampling thread (VmHWM cannot be reset per phase)."""

    def __init__(self, every: float = 0.2):
        self.every, self.peak, self._stop = every, rss_mb(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_mb())


def write_corpus(folder: Path, mb: int, files: int = 512, seed: int = 0) -> int:
    """``mb`` MB of lines of random words in ``files`` files, written block by block."""
    rng = np.random.default_rng(seed)
    words = np.array(["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyzé"), size=n))
                      for n in rng.integers(2, 10, size=5000)])
    folder.mkdir(parents=True, exist_ok=True)
    # ~4 MB of random lines made once, then written from a random line onwards each time
    # (generating every byte afresh in Python took minutes per GB on a loaded machine)
    lines = [" ".join(words[rng.integers(0, len(words), size=12)]) + "\n" for _ in range(60000)]
    per_file, total = mb * 10**6 // files, 0
    for i in range(files):
        with open(folder / f"part{i:04d}.txt", "w", encoding="utf-8") as f:
            written = 0
            while written < per_file:
                k = int(rng.integers(0, len(lines)))
                block = "".join(lines[k:] + lines[:k]).encode()[:per_file - written]
                f.write(block.decode("utf-8", "ignore"))
                written += len(block)
            total += written
    return total


def bench_tokenise(args, work: Path) -> None:
    import tasks

    corpus = work / "corpus"
    print(f"writing a {args.corpus_mb} MB corpus into {corpus} ...", flush=True)
    size = write_corpus(corpus, args.corpus_mb)
    os.environ["SSM_WORKBENCH_DATA"] = str(work / "cache")
    # 5% of 512 files each for valid and test: about 25 documents in each
    t = tasks.build("lm", source=str(corpus), tokenizer=args.tokenizer, seq_len=1024,
                    valid_fraction=0.05, test_fraction=0.05,
                    **({"vocab_size": 1024} if args.tokenizer == "bpe" else {}))
    start = rss_mb()
    t0 = time.perf_counter()
    with PeakRSS() as peak:
        data = t.data
    secs = time.perf_counter() - t0
    grew = peak.peak - start
    print(f"tokenise ({args.tokenizer}): corpus {size / 1e6:.0f} MB, {sum(data.meta['splits'][s]['tokens'] for s in data.meta['splits']):,} "
          f"tokens in {secs:.1f} s ({size / 1e6 / secs:.1f} MB/s)")
    print(f"  RSS before {start:.0f} MiB, peak {peak.peak:.0f} MiB: grew {grew:.0f} MiB "
          f"({'within' if grew < args.budget_mb else 'OVER'} the {args.budget_mb} MiB budget; "
          f"the corpus is {size / 2**20:.0f} MiB)")


def bench_speed(args, work: Path) -> None:
    """Tokenisation speed on a named source, each tokenizer in a fresh cache: the fit
    (char vocabulary, BPE training) timed apart from the tokenising pass."""
    import tasks

    for i, kind in enumerate(args.speed.split(",")):
        os.environ["SSM_WORKBENCH_DATA"] = str(work / f"speed-{i}")
        t = tasks.build("lm", source=args.source, tokenizer=kind,
                        **({"vocab_size": args.bpe_vocab} if kind == "bpe" else {}))
        t0 = time.perf_counter()
        t.tokenizer
        t1, c1 = time.perf_counter(), cpu_s()
        data = t.data
        t2, c2 = time.perf_counter(), cpu_s()
        mb = sum(s["text_bytes"] for s in data.meta["splits"].values()) / 1e6
        tokens = sum(s["tokens"] for s in data.meta["splits"].values())
        print(f"speed {kind:5s} on {args.source}: {mb:.1f} MB -> {tokens:,} tokens; fit {t1 - t0:.1f} s, "
              f"tokenise {t2 - t1:.1f} s = {mb / (t2 - t1):.2f} MB/s ({mb / (t2 - t0):.2f} MB/s with the fit); "
              f"tokenising used {c2 - c1:.1f} CPU s (all threads; {mb / max(c2 - c1, 1e-9):.2f} MB per CPU s: "
              "what a loaded machine's wall time hides)",
              flush=True)


def bench_sample(args, work: Path) -> None:
    from tasks.lm.tokenfile import TokenFile

    path = work / "sparse.tokens"
    n = int(args.token_gb * 1e9) // 2
    with open(path, "wb") as f:
        f.truncate(n * 2)   # a hole: no disk blocks, reads as zeros
    f = TokenFile(path, "<u2")
    rng = np.random.default_rng(0)
    B, L = 64, 1025
    print(f"sampling {args.steps} batches of {B} x {L} from a {n * 2 / 1e9:.1f} GB sparse token file")
    for how in ("pread", "memmap"):
        mm = f.memmap() if how == "memmap" else None
        start = rss_mb()
        t0 = time.perf_counter()
        marks = []
        for step in range(1, args.steps + 1):
            starts = rng.integers(0, n - L, size=B)
            if mm is None:
                f.windows(starts, L)
            else:
                np.stack([np.asarray(mm[s:s + L], dtype=np.int64) for s in starts])
            if step % max(1, args.steps // 5) == 0:
                marks.append(f"step {step}: {rss_mb():.0f}")
        secs = time.perf_counter() - t0
        print(f"  {how:6s}: RSS MiB {start:.0f} at start; " + ", ".join(marks)
              + f"  ({args.steps / secs:.0f} batches/s)")
        del mm


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m tasks.lm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus-mb", type=int, default=1024, help="size of the generated corpus (MB)")
    p.add_argument("--budget-mb", type=int, default=256,
                   help="RSS growth allowed while tokenising (MiB), below the corpus' size")
    p.add_argument("--tokenizer", default="bytes", choices=("bytes", "char", "bpe"))
    p.add_argument("--token-gb", type=float, default=10.0, help="size of the sparse token file (GB)")
    p.add_argument("--steps", type=int, default=2000, help="batches drawn from it")
    p.add_argument("--skip", choices=("tokenise", "sample"), action="append", default=[])
    p.add_argument("--speed", metavar="TOKENIZERS",
                   help="only measure tokenisation speed of --source with these (e.g. bytes,char,bpe)")
    p.add_argument("--source", default="stdlib", help="the source --speed tokenises (default stdlib)")
    p.add_argument("--bpe-vocab", type=int, default=4096, help="BPE vocabulary size for --speed")
    p.add_argument("--dir", help="working folder (default: a temporary one, removed after)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    args = p.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="lm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.speed:
            bench_speed(args, work)
            return
        if "tokenise" not in args.skip:
            bench_tokenise(args, work)
        if "sample" not in args.skip:
            bench_sample(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
