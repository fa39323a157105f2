"""An evaluation run's table in the run view at 80x24 (issue 42 items 4, 7): the plots'
place is about 44 columns there, and the table was cut to 'tiny_…', 'word_perplexi…',
'value ± std…' and 'sampl…'. Its headers and title are short now, each task is a line
of its own with its metrics under it, and a name too long still
is folded onto a second line, never cut."""
from __future__ import annotations

from rich.console import Console

from workbench.store import Run
from workbench.tui.run_view import eval_table

RESULTS = {"": {"params": 58496.0, "wall_s": 2.4},
           "tiny_py": {"bits_per_byte": 4.4851657778020755, "bits_per_byte_stderr": None, "samples": 5.0,
                       "word_perplexity": 1486630.8120932751, "word_perplexity_stderr": None},
           "hellaswag": {"acc": 0.3125, "acc_stderr": 0.0117, "acc_norm": 0.35, "acc_norm_stderr": 0.012,
                         "samples": 10042.0},
           "lambada_openai": {"acc": 0.3125, "acc_stderr": 0.0117, "perplexity": 40.31, "perplexity_stderr": 1.5,
                              "samples": 5153.0}}


def _run() -> Run:
    return Run(id=4, profile="eval", idx=0, model="run:2", label="run:2", task="lm-eval", seq_len=None, seed=0,
               spec={"kind": "eval", "eval": {"tasks": ["tiny_py", "hellaswag", "lambada_openai"]}}, fields={},
               state="finished", device="cpu", slot="cpu0", host="vm", pid=1, pid_start=None, created=0.0,
               started=0.0, ended=1.0, heartbeat=None, progress=1.0, step=1, total_steps=1, epoch=None,
               last_loss=None, last_accuracy=None, backend=None, error=None, info={}, log_path=None)


def rendered(width: int, sets=("", "tiny_py", "hellaswag")) -> str:
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(eval_table(_run(), {k: v for k, v in RESULTS.items() if k in sets}))
    return console.export_text()


def test_the_eval_table_fits_the_80x24_run_view_whole():
    text = rendered(44)  # the plots' width in a run view at 80x24
    assert "…" not in text, text
    assert text.splitlines()[0].strip() == "lm-eval results"  # (a title wraps at the table's width)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "tiny_py 5" in lines and "bits_per_byte 4.4852" in lines, text
    assert "word_perplexity 1.4866e+06" in lines, text
    assert "hellaswag 10,042" in lines and "acc 0.312 ± 0.012" in lines and "acc_norm 0.350 ± 0.012" in lines, text
    assert all(len(line) <= 44 for line in text.splitlines())
    # longer names, or narrower still: folded onto the next line rather than cut
    assert "…" not in rendered(44, sets=("", "tiny_py", "lambada_openai"))
    assert "…" not in rendered(34)
