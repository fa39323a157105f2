"""The CLI's runs table labels train and eval figures apart and shows a language model's
eval bits per byte, as the TUI's runs table does (issue 42 item 1: "train and eval numbers
labelled apart everywhere"). Before, `ssm-workbench runs` and the table `run` prints at its
end headed the last train loss "loss" and an lm run's next-token accuracy "acc" (0.038 for
a BPE run whose bits per byte, 3.86, beat the bytes run's 4.19, which read 0.276)."""
from __future__ import annotations

import io
import os

from rich.console import Console

from helpers import tiny_lm_corpus, tiny_lm_profile_text, tiny_profile_text
from workbench.cli import runs as cli_runs
from workbench.spec import profile as profiles
from workbench.store import Store


def _add(store: Store, text: str, accuracy: float, bpb: float | None) -> list[int]:
    ids = store.add_runs(s.to_dict() for s in profiles.expand(profiles.loads(text)))
    for rid in ids:
        store.mark_started(rid, os.getpid(), "cpu", None)
        rows = [(4, None, "eval", "accuracy", accuracy)]
        if bpb is not None:
            rows.append((4, None, "eval", "bits_per_byte", bpb))
        store.add_metrics(rid, rows)
        store.heartbeat(rid, step=4, progress=1.0, last_loss=2.5, last_accuracy=accuracy)
        store.finish(rid, "finished")
    return ids


def _table(store: Store, runs) -> list[list[str]]:
    buf = io.StringIO()
    cli_runs._print_runs(Console(width=160, file=buf, color_system=None), runs, store=store)
    return [[c.strip() for c in line.split("│" if "│" in line else "┃")[1:-1]]
            for line in buf.getvalue().splitlines() if "│" in line or "┃" in line]


def test_lm_runs_show_eval_bits_per_byte_and_train_loss_is_labelled(tmp_path):
    store = Store(tmp_path / "store")
    corpus = tiny_lm_corpus(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog. ")
    lm = _add(store, tiny_lm_profile_text(corpus, "lm-labels", models=("transformer",)), 0.038, 3.86)
    header, *rows = _table(store, store.runs(ids=lm))
    assert "train_loss" in header and "eval_bpb" in header and "acc" not in header, header
    assert rows[0][header.index("eval_bpb")] == "3.860"  # not the accuracy, 0.038
    assert rows[0][header.index("train_loss")] == "2.5"
    # other runs beside them: the column says it holds both; alone, accuracy as before
    other = _add(store, tiny_profile_text("other", models=("lstm",), steps=4), 0.75, None)
    header = _table(store, store.runs())[0]
    assert "eval_acc|bpb" in header, header
    header, *rows = _table(store, store.runs(ids=other))
    assert "eval_acc" in header and rows[0][header.index("eval_acc")] == "0.750"


def test_evaluation_runs_beside_lm_runs_leave_the_header_at_bits_per_byte(tmp_path):
    """An evaluation run's cell is always empty: beside lm runs the column still holds bits
    per byte only, and says so (it read eval acc|bpb in the TUI and here)."""
    from workbench.spec.eval_spec import eval_spec
    from workbench.tui.run_cells import accuracy_header

    store = Store(tmp_path / "store")
    corpus = tiny_lm_corpus(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog. ")
    _add(store, tiny_lm_profile_text(corpus, "lm-labels", models=("transformer",)), 0.038, 3.86)
    store.add_runs([eval_spec("run:1", ["tiny_py"])])
    runs = store.runs()
    assert {r.task for r in runs} == {"lm", "lm-eval"}
    assert accuracy_header(runs) == "eval bpb"
    header = _table(store, runs)[0]
    assert "eval_bpb" in header, header


def test_export_opens_lm_runs_on_bits_per_byte_and_evaluations_on_their_metric(tmp_path, capsys):
    """`run` ends with "Table: ssm-workbench export --profile NAME": for a profile of lm runs
    that table was next-token accuracy (as the Results tab opens such a profile, it is bits
    per byte now), and for evaluation runs of tasks of one's own a column 'seq_len=–' of
    dashes (now their metric by eval set)."""
    from workbench import cli
    from workbench.spec.eval_spec import eval_spec

    store = Store(tmp_path / "store")
    corpus = tiny_lm_corpus(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog. ")
    (lm,) = _add(store, tiny_lm_profile_text(corpus, "lm-labels", models=("transformer",)), 0.038, 3.86)
    store.set_results(lm, {"accuracy": 0.038, "bits_per_byte": 3.86, "loss": 5.2, "params": 1000})
    assert cli.main(["--store", str(store.root), "export", "--profile", "lm-labels"]) == 0
    out = capsys.readouterr().out
    assert "| transformer | 3.860 (n=1) |" in out and out.count("bits_per_byte:") == 1, out
    (ev,) = store.add_runs([eval_spec("run:1", ["tiny_py"])])
    store.mark_started(ev, os.getpid(), "cpu", None)
    store.set_results(ev, {"word_perplexity": 1.8e6, "bits_per_byte": 4.55}, eval_set="tiny_py")
    store.set_results(ev, {"params": 1000})
    store.finish(ev, "finished")
    assert cli.main(["--store", str(store.root), "export", "--profile", "eval"]) == 0
    out = capsys.readouterr().out
    assert "| model \\ eval_set | eval_set=tiny_py |" in out and "| run:1 | 4.550 (n=1) |" in out, out


def test_show_lists_an_lm_runs_loss_perplexity_and_bits_per_byte_first(tmp_path, capsys):
    """`show`'s results line led with accuracy (alphabetical) for a language model too."""
    from workbench import cli

    store = Store(tmp_path / "store")
    corpus = tiny_lm_corpus(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog. ")
    (lm,) = _add(store, tiny_lm_profile_text(corpus, "lm-labels", models=("transformer",)), 0.038, 3.86)
    store.set_results(lm, {"accuracy": 0.038, "bits_per_byte": 3.86, "loss": 5.2, "perplexity": 181.3,
                           "best_accuracy": 0.04, "params": 1000})
    assert cli.main(["--store", str(store.root), "show", str(lm)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "results: loss=5.2, perplexity=181.3, bits_per_byte=3.86, accuracy=0.038" in out, out
