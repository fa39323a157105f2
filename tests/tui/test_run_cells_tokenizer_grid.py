"""A tokenizer grid's runs tell apart in the runs table at 80x24 (issue 42 items 4, 6): the
grid point of a tokenizer table ({name = "bpe", vocab_size = 1024}) reads
'tokenizer=bpe/1024'; as 'tokenizer=bpe vocab_size=1024' it was cut to 'tokenizer=bpe
vocab_si…' in the 23 columns the table had for it, the same for every vocabulary size."""
from __future__ import annotations

from workbench.store import Run
from workbench.tui.run_cells import grid_labels, grid_text

# the grid column's width in an 80x24 runs table of one such profile (id, model, grid,
# state, progress, eval bpb), as the audit's capture showed it
NARROW_GRID = 23


def run(rid: int, grid: dict) -> Run:
    return Run(id=rid, profile="lm-tok3", idx=rid, model="transformer", label="transformer", task="lm",
               seq_len=64, seed=0, spec={"grid": grid}, fields={}, state="finished", device="cpu",
               slot="cpu0", host="vm", pid=1, pid_start=None, created=0.0, started=0.0, ended=1.0,
               heartbeat=None, progress=1.0, step=1, total_steps=1, epoch=None, last_loss=None,
               last_accuracy=None, backend=None, error=None, info={}, log_path=None)


def test_a_tokenizer_and_its_vocabulary_read_as_one_short_value():
    runs = [run(7, {"task.tokenizer": "bytes"}),
            run(8, {"task.tokenizer": "bpe", "task.vocab_size": 512}),
            run(9, {"task.tokenizer": "bpe", "task.vocab_size": 1024})]
    labels = grid_labels(k for r in runs for k in r.spec["grid"])
    texts = [grid_text(r, labels) for r in runs]
    assert texts == ["tokenizer=bytes", "tokenizer=bpe/512", "tokenizer=bpe/1024"]
    assert all(len(t) <= NARROW_GRID for t in texts)
    # other axes beside it as before
    other = run(10, {"task.tokenizer": "bpe", "task.vocab_size": 512, "train.lr": 1e-3})
    assert grid_text(other, grid_labels(other.spec["grid"])) == "tokenizer=bpe/512 lr=1e-3"
