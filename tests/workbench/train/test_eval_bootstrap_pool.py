"""lm-eval's bootstrap pool in an evaluation process that runs threads
(workbench/train/eval_run.py ``bootstrap_pools_from_a_clean_process``): a pool worker
forked while another thread held a lock waited on it forever, and the eval run hung at
"bootstrapping for stddev". The pool's workers must start clean, and give lm-eval's own
numbers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from test_lm_eval_tasks import needs_lm_eval

pytestmark = needs_lm_eval
ROOT = Path(__file__).resolve().parents[3]

# the statistic takes a lock that, in the evaluating process, another thread holds for good:
# a worker forked from that process inherits the lock held and never returns
HELD = textwrap.dedent('''
    import threading

    LOCK = threading.Lock()


    def held_mean(xs):
        with LOCK:
            return sum(xs) / len(xs)


    def mean(xs):
        return sum(xs) / len(xs)
''')

SCRIPT = textwrap.dedent('''
    import threading, time
    import held
    from workbench.train import eval_run
    from lm_eval.api import metrics

    eval_run.bootstrap_pools_from_a_clean_process()
    threading.Thread(target=lambda: (held.LOCK.acquire(), time.sleep(3600)), daemon=True).start()
    time.sleep(0.2)
    xs = [float(i * i % 17) for i in range(40)]
    pooled = metrics.bootstrap_stderr(held.held_mean, xs, iters=40)
    alone = metrics.sample_stddev(metrics._bootstrap_internal_no_mp(held.mean, xs, 40))
    print(repr(pooled), repr(alone))
''')


def test_the_bootstrap_pool_of_a_threaded_eval_process_finishes_with_lm_evals_numbers(tmp_path):
    (tmp_path / "held.py").write_text(HELD)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the process and its hung pool workers
        proc.communicate()
        raise AssertionError("lm-eval's bootstrap pool hung: its workers were forked with a lock held") \
            from None
    assert proc.returncode == 0, stderr[-2000:]
    pooled, alone = stdout.split()[-2:]
    assert float(pooled) == float(alone) > 0  # the same resamples and seeds as lm-eval's serial path
