#!/usr/bin/env python
"""Benchmark what a user waits for before a sweep starts (not a test: numbers, no assertions).

Times, each as a fresh process with an EMPTY probe cache (``XDG_CACHE_HOME`` a new
temporary folder; the compiled CPU kernels are kept, ``SSM_WORKBENCH_KERNEL_CACHE``, since
building them is a once-per-machine cost, not the dry run's):

- ``run --dry-run`` of an eight-model sweep (transformer, mamba, mamba2, mamba3, rwkv7,
  gla, hyena, lstm on MQAR) at width 64, and the same matched by ``[sweep.match] params =
  1M``, and by ``state_size = 1M`` (refused: the transformer has no fixed-size state);
- ``profile check profiles/*.toml`` of the checkout;
- ``profile check`` of a profile whose model list has 55,000 entries (refused).

Each row: wall and CPU seconds (user + sys of the child), the median of ``--repeat``
tries, and the exit status. Since other jobs share the machine, the load average is
printed with the table; compare checkouts as ratios taken at the same time, e.g. the
code before a change in a worktree against the current one, interleaved:

    git worktree add /tmp/before HEAD~3
    .venv/bin/python scripts/bench-dry-run.py --repo /tmp/before --repo . --repeat 2

``--repo`` may be given several times; each case runs once per repository in turn
(interleaved), so a load change hits both alike. The interpreter is this one; the code is
the repository's (it runs with the repository as its working folder, first on sys.path).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = ["transformer", "mamba", "mamba2", "mamba3", "rwkv7", "gla", "hyena", "lstm"]

SWEEP = """schema_version = 2
name = "{name}"
[task]
name = "mqar"
seq_len = 64
num_kv_pairs = 4
vocab_size = 128
num_train_examples = 2000
num_test_examples = 200
[sweep]
models = {models}
seeds = [0]
[model]
n_layers = 2
{width}
[train]
epochs = 1
batch_size = 32
device = "cpu"
{match}
"""


def _profiles(folder: Path) -> dict[str, Path]:
    """The benchmark's profiles, written into ``folder``."""
    import json

    out = {}
    cases = {"sweep8": ("d_model = 64", ""),
             "sweep8-params": ("", "[sweep.match]\nparams = 1000000"),
             "sweep8-state": ("", "[sweep.match]\nstate_size = 1000000")}
    for name, (width, match) in cases.items():
        out[name] = folder / f"{name}.toml"
        out[name].write_text(SWEEP.format(name=name, models=json.dumps(MODELS), width=width, match=match))
    out["long-list"] = folder / "long-list.toml"
    out["long-list"].write_text(SWEEP.format(name="long-list", models=json.dumps(MODELS * 6875),
                                             width="d_model = 64", match=""))
    return out


def _time(cmd: list[str], cwd: Path, timeout: float, lm_eval_index: str | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit status) of one cold run of ``cmd`` in ``cwd``;
    ``lm_eval_index``: a file of lm-eval's task names (workbench.spec.lm_eval_tasks's
    cache) put in the empty cache first, as once per installation."""
    env = dict(os.environ)
    env.setdefault("SSM_WORKBENCH_KERNEL_CACHE",
                   str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ssm-workbench" / "kernels"))
    env["PYTHONPATH"] = str(cwd)
    with tempfile.TemporaryDirectory() as cache:
        env["XDG_CACHE_HOME"] = cache  # an empty probe cache: a cold check
        if lm_eval_index:
            import shutil

            (Path(cache) / "ssm-workbench").mkdir()
            shutil.copy(lm_eval_index, Path(cache) / "ssm-workbench" / "lm-eval-tasks.json")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, rc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", action="append", default=None, help="a checkout to time (repeatable; default .)")
    ap.add_argument("--repeat", type=int, default=1, help="tries per case and repository (median)")
    ap.add_argument("--only", default="", help="comma-separated case names to run (default all)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--lm-eval-index", default=None, metavar="FILE",
                    help="lm-eval's task-name index (~/.cache/ssm-workbench/lm-eval-tasks.json) to start "
                         "each cold run with: indexing lm-eval's 14k YAML files is once per installation "
                         "(default: indexed in every run, as on a fresh machine)")
    args = ap.parse_args()
    repos = [Path(r).resolve() for r in (args.repo or ["."])]
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        prof = _profiles(Path(tmp))
        cases = {
            "dry-run 8 models": ["run", "--dry-run", str(prof["sweep8"])],
            "dry-run 8 models, match params 1M": ["run", "--dry-run", str(prof["sweep8-params"])],
            "dry-run 8 models, match state 1M (refused)": ["run", "--dry-run", str(prof["sweep8-state"])],
            "profile check profiles/*.toml": None,
            "profile check, 55,000 models (refused)": ["profile", "check", str(prof["long-list"])],
        }
        only = [c.strip() for c in args.only.split(",") if c.strip()]
        rows = []
        for name, sub in cases.items():
            if only and not any(o in name for o in only):
                continue
            times: dict[Path, list[tuple[float, float, int]]] = {r: [] for r in repos}
            for _ in range(args.repeat):
                for repo in repos:  # interleaved: a change of load hits every checkout alike
                    argv = sub or ["profile", "check", *sorted(str(p) for p in (repo / "profiles").glob("*.toml"))]
                    times[repo].append(_time([py, "-m", "workbench", *argv], repo, args.timeout,
                                             args.lm_eval_index))
            for repo in repos:
                ts = times[repo]
                rows.append((name, str(repo), statistics.median(t[0] for t in ts),
                             statistics.median(t[1] for t in ts), ",".join(str(t[2]) for t in ts)))
    load = os.getloadavg()
    index = "kept" if args.lm_eval_index else "indexed in each run"
    print(f"cold runs (empty probe cache; lm-eval task index {index}), median of {args.repeat}; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    w = max(len(r[0]) for r in rows)
    wr = max(len(r[1]) for r in rows)
    print(f"{'case':<{w}}  {'repository':<{wr}}  {'wall s':>7}  {'CPU s':>7}  exit")
    for name, repo, wall, cpu, rc in rows:
        print(f"{name:<{w}}  {repo:<{wr}}  {wall:7.2f}  {cpu:7.2f}  {rc}")


if __name__ == "__main__":
    main()
