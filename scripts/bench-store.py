#!/usr/bin/env python
"""Benchmark the workbench on a large store (not a test: numbers, no assertions).

Makes a store of 5,000 runs in a temporary folder (a 5,000-point grid profile, expanded:
4,000 finished with results and METRICS metric rows each, 4 running, the rest pending) and
times, each the median of --repeat tries:

- load + check + expand of the 5,000-run grid profile (in process, and in a fresh process
  including imports, as ``ssm-workbench profile check`` would),
- ``ssm-workbench runs --store DIR`` as a subprocess (output to a file),
- the same table built in process (store read + rich table + per-profile summary),
- one TUI poll of the runs table: the worker thread's store read (reap, runs, Slurm sync)
  and the UI thread's table update, in a headless app, unchanged and with 4 runs changed.

Run: ``.venv/bin/python scripts/bench-store.py [--runs-metrics 50] [--repeat 3]``.
Results are in docs/RESULTS.md ("Large stores").
"""
from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRID = """\
schema_version = 2
name = "big"
[task]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 64
num_test_examples = 16
[sweep]
models = ["transformer", "lstm"]
seq_lens = [12]
seeds = [0, 1, 2, 3, 4]
[sweep.grid]
"train.lr" = [1e-4, 5e-4]
"train.weight_decay" = [0.0, 0.01, 0.02, 0.05, 0.1]
"train.warmup_steps" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"train.batch_size" = [2, 4, 8, 16, 32]
[model]
d_model = 16
n_layers = 2
[model.options.transformer]
n_heads = 2
[train]
steps = 20
batch_size = 4
"""

EXPAND = """\
import sys, time
t0 = time.perf_counter()
from workbench.spec import profile as P
n = len(P.expand(P.load(sys.argv[1])))
print(n, time.perf_counter() - t0)
"""


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_store(root: Path, specs: list[dict], n_metrics: int):
    from workbench.store import Store

    store = Store(root)
    ids = store.add_runs(specs)
    t0 = 1_700_000_000.0
    c = store.conn
    finished = ids[:4000]
    running = ids[4000:4004]
    c.executemany("UPDATE runs SET state='finished', device='cpu', started=?, ended=?, heartbeat=?,"
                  " progress=1.0, step=20, total_steps=20, last_loss=0.1, last_accuracy=0.9 WHERE id=?",
                  [(t0 + i, t0 + i + 30 + i % 7, t0 + i + 30, rid) for i, rid in enumerate(finished)])
    now = time.time()
    # running runs of this process (so that reap leaves them be), with fresh heartbeats
    c.executemany("UPDATE runs SET state='running', device='cpu', started=?, heartbeat=?, pid=?,"
                  " host=?, progress=0.5, step=10, total_steps=20 WHERE id=?",
                  [(now - 15, now, os.getpid(), os.uname().nodename, rid) for rid in running])
    # pid_start must match for pid_alive: take this process's own
    import psutil
    c.execute("UPDATE runs SET pid_start=? WHERE state='running'", (psutil.Process().create_time(),))
    c.executemany("INSERT INTO metrics (run_id, step, epoch, split, name, value, t) VALUES (?,?,?,?,?,?,?)",
                  [(rid, s, None, "train" if s % 5 else "eval", "loss" if s % 5 else "accuracy",
                    1.0 / (s + 1), t0 + s) for rid in finished for s in range(n_metrics)])
    c.executemany("INSERT INTO results (run_id, eval_set, name, value) VALUES (?,?,?,?)",
                  [(rid, es, name, 0.5 + (rid % 100) / 200) for rid in finished
                   for es in ("", "valid") for name in ("accuracy", "sequence_accuracy", "loss")]
                  + [(rid, "", "wall_s", 30.0) for rid in finished])
    c.commit()
    return store, ids


async def tui_poll(store_root: Path, repeat: int) -> dict[str, float]:
    from workbench.execute import slurm
    from workbench.store import Store
    from workbench.tui import runs_table
    from workbench.tui.app import WorkbenchApp

    store = Store(store_root)
    app = WorkbenchApp(store=store, profiles_dir=Path(tempfile.mkdtemp()), scheduler=object())
    out: dict[str, float] = {}
    async with app.run_test(size=(140, 40)) as pilot:
        for _ in range(3):  # the first poll fills the table (5,000 rows added)
            await app.workers.wait_for_complete()
            await pilot.pause(0.6)
        await app.workers.wait_for_complete()

        def read():
            store.reap()  # as WorkbenchApp._read_runs (its table_runs: with grid points)
            runs = runs_table.table_runs(store)
            slurm.sync(store, runs=runs)
            return runs

        out["poll: store read (worker thread)"] = median_time(read, repeat)
        runs = read()
        out["poll: table update, nothing changed (UI thread)"] = median_time(lambda: app._show_runs(runs), repeat)

        def changed():
            store.conn.execute("UPDATE runs SET progress=progress+0.001, step=step+1 WHERE state='running'")
            store.conn.commit()
            app._show_runs(read())

        t = median_time(changed, repeat)
        out["poll: read + table update, 4 runs changed"] = t
        t0 = time.perf_counter()
        app._show_runs(read())
        out["poll: whole (read + update), nothing changed"] = time.perf_counter() - t0
        # sorted by elapsed time: the running runs' values move, so every poll re-sorts
        table = app.query_one(runs_table.RunsTable)
        t0 = time.perf_counter()
        table.sort_by("elapsed", reverse=True)
        out["sort 5,000 rows by elapsed (the s key)"] = time.perf_counter() - t0
        out["poll: read + table update + re-sort, sorted by elapsed"] = median_time(changed, repeat)
        table.sort_by("id")
        t0 = time.perf_counter()
        table.set_filter(runs_table.RunFilter("state:running,pending model:lstm"))
        out["filter to state:running,pending model:lstm (rows removed)"] = time.perf_counter() - t0
        out["poll: read + table update, filtered"] = median_time(changed, repeat)
        t0 = time.perf_counter()
        table.set_filter(runs_table.RunFilter())
        out["filter cleared (4,996 rows added back)"] = time.perf_counter() - t0
        await pilot.pause()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-metrics", type=int, default=50, help="metric rows per finished run")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    exe = str(Path(sys.executable).parent / "ssm-workbench")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"cpus: {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prof_path = tmp / "big.toml"
        prof_path.write_text(GRID)
        res: dict[str, float] = {}
        sub = []
        for _ in range(args.repeat):
            p = subprocess.run([sys.executable, "-c", EXPAND, str(prof_path)], capture_output=True,
                               text=True, cwd=ROOT, check=True)
            n, took = p.stdout.split()
            sub.append(float(took))
        res[f"expand+check {n}-run grid, fresh process incl. imports"] = statistics.median(sub)
        from workbench.spec import profile as P

        res["expand+check, in process (imports done)"] = median_time(lambda: P.expand(P.load(prof_path)), args.repeat)
        specs = [s.to_dict() for s in P.expand(P.load(prof_path))]
        t0 = time.perf_counter()
        store, ids = make_store(tmp / "store", specs, args.runs_metrics)
        print(f"store: {len(ids)} runs, {args.runs_metrics} metric rows per finished run, "
              f"made in {time.perf_counter() - t0:.1f} s")

        def runs_cli():
            with open(tmp / "runs.txt", "w") as f:
                subprocess.run([exe, "--store", str(tmp / "store"), "runs"], stdout=f, check=True)

        res["`ssm-workbench runs` subprocess (5,000 rows)"] = median_time(runs_cli, args.repeat)
        res["python -c 'import workbench.cli; parser()' (start-up part of it)"] = median_time(
            lambda: subprocess.run([sys.executable, "-c", "import workbench.cli as c; c.parser()"],
                                   check=True), args.repeat)
        from rich.console import Console

        from workbench.cli import runs as cli_runs
        from workbench.store import progress

        def runs_in_process():  # as cmd_runs: the light read, the table, the progress lines
            runs = progress.table_runs(store)
            cli_runs._print_runs(Console(file=io.StringIO(), width=160), runs)

        res["runs table in process (read + table + summary)"] = median_time(runs_in_process, args.repeat)
        res["table_runs() alone (5,000 rows, no spec JSON)"] = median_time(lambda: progress.table_runs(store),
                                                                           args.repeat)
        res["store.runs() alone (5,000 rows, specs decoded)"] = median_time(store.runs, args.repeat)
        res.update(asyncio.run(tui_poll(tmp / "store", args.repeat)))
        store.close()
    w = max(map(len, res))
    for k, v in res.items():
        print(f"{k:<{w}}  {1000 * v:8.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
