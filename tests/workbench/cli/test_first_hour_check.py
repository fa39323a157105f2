"""`profile check` on a fresh clone (issue 32, items 3 and 10).

- Shipped profiles whose data or checkpoints are not in the repository ([[needs]]) are a
  state of their own, "needs data", with the exact command that fetches each path; it is
  not a failure. A line of counts ends the output; exit 2 only when a profile is invalid.
- The GPT-Neo profiles' hints name GPT-Neo, never the Mamba checkpoint.
- The estimate's probe frees what its forward kept, is shared by task settings of the same
  model shape, runs on one thread, and never builds a model too big to build: its estimate
  is then a lower bound, and a run without a full estimate never reads as "fits yes".
- The schema: a profile name that makes file names too long is refused, task integers
  beyond 64 bits are refused by name, and a quoted number is refused in every table.
(Times and memory are not asserted here: the measurements are in the commit messages.)
"""
from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from helpers import tiny_profile_text
from workbench.spec import cost_probe, estimate
from workbench.spec import profile as P

ROOT = Path(__file__).resolve().parents[3]
PROFILES = ROOT / "profiles"
NEED_DATA = ["char-lm-shakespeare", "imdb-gptneo-frozen", "imdb-hybrid-frozen", "imdb-lora", "imdb-mamba-frozen"]

SMALL = tiny_profile_text("small", schema_version=2, models=["transformer"], seq_lens=[12], examples=(32, 16),
                          d_model=16, steps=4, batch_size=4)


def cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    # run where a fresh clone's user would: no data/ or checkpoints/ folder in the way
    full = dict(os.environ, **env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=600)


# --------------------------------------------------------------------------- needs data
def test_shipped_profiles_that_need_data_say_so_with_their_own_commands(tmp_path, cache_env):
    small = tmp_path / "small.toml"
    small.write_text(SMALL)
    files = [str(PROFILES / f"{n}.toml") for n in NEED_DATA] + [str(small)]
    r = cli(tmp_path, cache_env, "--store", str(tmp_path / "store"), "profile", "check", *files)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "invalid profile" not in r.stderr, r.stderr
    for n in NEED_DATA:
        assert re.search(rf"^↓ \S*{n}\.toml: profile '{n}', .*needs data that is absent", out, re.M), (n, out)
    assert "6 profiles: 1 valid, 0 invalid, 5 need data that is absent" in out, out
    assert "✓ " in out and "small" in out  # the valid one still gets its estimate table
    # each path with the command that fetches it, whole on one line (to be pasted)
    neo = ("hf download EleutherAI/gpt-neo-125m --local-dir checkpoints/gpt-neo-125m && python -c "
           "\"from transformers import AutoTokenizer; AutoTokenizer.from_pretrained('checkpoints/gpt-neo-125m')"
           ".save_pretrained('checkpoints/gpt-neo-125m')\"")
    assert f"      {neo}\n" in out, out
    assert ("mkdir -p data && curl -L -o data/tinyshakespeare.txt "
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt") in out
    assert "aclImdb_v1.tar.gz | tar -xz -C data" in out
    # the GPT-Neo folders are never told to fetch the Mamba checkpoint
    assert "state-spaces/mamba-130m-hf --local-dir checkpoints/gpt-neo-125m" not in out + r.stderr
    gptneo = out.split("imdb-gptneo-frozen.toml")[1].split("↓")[0]
    assert "mamba" not in gptneo.lower(), gptneo
    assert not (tmp_path / "store").exists()


def test_exit_2_only_for_an_invalid_profile_and_run_refuses_absent_data(tmp_path, cache_env):
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.replace("batch_size = 4", "batchsize = 4"))
    r = cli(tmp_path, cache_env, "profile", "check", str(PROFILES / "char-lm-shakespeare.toml"), str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "bad.toml: invalid profile" in r.stderr and "batchsize" in r.stderr
    assert "2 profiles: 0 valid, 1 invalid, 1 needs data that is absent" in r.stdout, r.stdout
    # `run` cannot run it: refused before any store exists, with the same command
    r = cli(tmp_path, cache_env, "--store", str(tmp_path / "store"), "run", str(PROFILES / "char-lm-shakespeare.toml"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs data that is absent" in r.stderr and "curl -L -o data/tinyshakespeare.txt" in r.stderr
    assert not (tmp_path / "store").exists()


def test_every_shipped_path_outside_the_repository_is_a_need(tmp_path, monkeypatch):
    """A shipped profile that reads data/ or checkpoints/ declares it, so on a fresh clone
    it is "needs data", never invalid."""
    monkeypatch.chdir(tmp_path)  # nothing fetched here
    readers = [f for f in sorted(PROFILES.glob("*.toml")) if re.search(r'"(data|checkpoints)/', f.read_text())]
    assert {f.stem for f in readers} >= set(NEED_DATA)
    for f in readers:
        with pytest.raises(P.DataAbsent) as e:
            P.load(f)
        assert e.value.needs and all(n.fetch for n in e.value.needs), f


def test_a_need_counts_only_while_the_profile_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = PROFILES / "char-lm-shakespeare.toml"
    with pytest.raises(P.DataAbsent) as e:
        P.load(f)
    assert [n.path for n in e.value.needs] == ["data/tinyshakespeare.txt"]
    text = "To be, or not to be: that is the question.\n" * 400
    (tmp_path / "elsewhere.txt").write_text(text)
    P.load(f, overrides=[f"task.path={tmp_path / 'elsewhere.txt'}"])  # pointed elsewhere: no need
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tinyshakespeare.txt").write_text(text)
    P.load(f)  # fetched: valid


def test_the_form_lists_each_absent_path_with_its_command(tmp_path, monkeypatch):
    from workbench.spec.check import registry_problems

    monkeypatch.chdir(tmp_path)
    prof = P.load(PROFILES / "char-lm-shakespeare.toml", check_registries=False)
    [(loc, msg)] = registry_problems(prof)
    assert loc == () and msg.startswith("data/tinyshakespeare.txt") and "fetch it with: mkdir -p data" in msg


def test_a_missing_checkpoint_folder_names_its_own_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()  # without it, "ckpt/neo" would name a Hub repository (models/hub.py)
    base = SMALL.replace('models = ["transformer"]', 'models = ["{model}"]')
    cases = [("pretrained_causal_lm", 'path = "ckpt/neo"', ["EleutherAI/gpt-neo-125m --local-dir ckpt/neo"]),
             ("pretrained_hybrid", 'gptneo_path = "ckpt/neo"\nmamba_path = "ckpt/mamba"',
              ["EleutherAI/gpt-neo-125m --local-dir ckpt/neo"]),
             ("pretrained_mamba", 'path = "ckpt/mamba"', ["state-spaces/mamba-130m-hf --local-dir ckpt/mamba"])]
    for model, opts, wanted in cases:
        text = base.format(model=model) + f"[model.options.{model}]\n{opts}\n"
        with pytest.raises(P.ProfileError) as e:
            P.loads(text, "p.toml")
        assert not isinstance(e.value, P.DataAbsent)
        for w in wanted:
            assert w in str(e.value), str(e.value)
        assert "mamba-130m-hf --local-dir ckpt/neo" not in str(e.value)


# --------------------------------------------------------------------------- the probe
def _live_graph_tensors() -> int:
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None)


def test_the_probe_frees_what_its_forward_kept():
    # sigmoid and tanh save their own outputs: a pack hook that returned them made a
    # reference cycle through autograd's C++ graph, and every probe leaked its activations
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(2, 16, 8)
    first = cost_probe.saved_bytes(net, x, None)
    before = _live_graph_tensors()
    for _ in range(3):
        assert cost_probe.saved_bytes(net, x, None) == first
    assert _live_graph_tensors() == before


def _isolated_probes(monkeypatch, calls: list):
    """Probes counted, on an empty cache, none written to disk."""
    monkeypatch.setattr(cost_probe, "_PROBES", {})
    monkeypatch.setattr(cost_probe, "_DISK", {})
    monkeypatch.setattr(cost_probe, "_save_disk_cache", lambda probes: None)
    real = cost_probe._probe_task

    def counted(task, model, *args):
        calls.append((task.vocab_size, model, torch.get_num_threads()))
        return real(task, model, *args)

    monkeypatch.setattr(cost_probe, "_probe_task", counted)


def test_task_settings_of_one_model_shape_share_a_probe_on_one_thread(monkeypatch):
    calls: list = []
    _isolated_probes(monkeypatch, calls)
    text = SMALL.replace("num_test_examples = 16",
                         "num_test_examples = 16\nvariants = { num_train_examples = [48, 64], vocab_size = [10] }")
    prof = P.loads(text, "p.toml")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ests = estimate.estimate_profile(prof)
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(threads)
    assert len(ests) == 4 and all(e.fits for e in ests)
    # baseline and the two training-set sizes: one model, one probe; the vocabulary: another
    assert sorted(v for v, _, _ in calls) == [8, 10]
    assert all(n == 1 for _, _, n in calls)


def test_a_model_too_big_to_build_is_not_built_and_its_estimate_is_a_lower_bound(monkeypatch):
    calls: list = []
    _isolated_probes(monkeypatch, calls)

    def never(*args):
        raise AssertionError("the probe must not build this model")

    monkeypatch.setattr(cost_probe, "_probe_task", never)
    text = (SMALL.replace('name = "mad_selective_copying"', 'name = "mqar"')
            .replace("vocab_size = 8\nnum_tokens_to_copy = 2", "vocab_size = 1073741824\nnum_kv_pairs = 2")
            .replace("d_model = 16", "d_model = 64"))
    prof = P.loads(text, "p.toml")
    [e] = estimate.estimate_profile(prof)
    assert e.lower_bound and e.fits is False, e.error  # 2 x 256 GiB of embedding and head alone
    assert "activations not measured" in e.error and e.params > 2 * (1 << 30) * 64
    assert estimate.too_big([e]) == [e] and "at least" in e.refusal()


def test_a_run_without_a_full_estimate_never_reads_as_fitting():
    from rich.console import Console

    from workbench.cli.run import _print_estimates

    failed = estimate.RunEstimate("m", "t", 64, 0, "cpu", limit=1 << 30, limit_what="RAM",
                                  error="no estimate: OverflowError: too big")
    low = estimate.RunEstimate("m", "t", 64, 0, "cpu", parts={"weights": 1 << 20}, limit=1 << 30,
                               lower_bound=True)
    over = estimate.RunEstimate("m", "t", 64, 0, "cpu", parts={"weights": 1 << 31}, limit=1 << 30,
                                lower_bound=True)
    assert failed.fits is None and low.fits is None and over.fits is False
    assert json.loads(json.dumps(failed.to_dict()))["fits"] is None
    assert estimate.too_big([failed, low, over]) == [over]
    console = Console(record=True, width=200)
    _print_estimates(console, [failed], per_run=True)
    table = console.export_text()
    row = next(line for line in table.splitlines() if line.startswith("m "))
    assert row.rstrip().endswith("?") and "yes" not in row, table


# --------------------------------------------------------------------------- the schema
def test_a_profile_name_must_make_usable_file_names():
    P.loads(SMALL.replace('name = "small"', f'name = "{"a" * 100}"'), "p.toml", check_registries=False)
    with pytest.raises(P.ProfileError) as e:
        P.loads(SMALL.replace('name = "small"', f'name = "{"a" * 300}"'), "p.toml", check_registries=False)
    msg = str(e.value)
    assert msg.startswith("p.toml: invalid profile") and "'name' (line 2)" in msg and "at most 100" in msg
    assert "a" * 101 not in msg  # the message does not repeat a 300-character name
    for bad in ("a/b", "../x", "a b", "-x"):
        with pytest.raises(P.ProfileError, match=r"'name' \(line 2\)"):
            P.loads(SMALL.replace('name = "small"', f'name = "{bad}"'), "p.toml", check_registries=False)


def test_task_integers_beyond_64_bits_are_refused_by_name():
    huge = 2 ** 63
    for text in (SMALL.replace("vocab_size = 8", f"vocab_size = {huge}"),
                 SMALL.replace("num_test_examples = 16", f"num_test_examples = 16\nvariants = {{ vocab_size = [{huge}] }}")):
        with pytest.raises(P.ProfileError) as e:
            P.loads(text, "p.toml")
        assert "vocab_size must fit a 64-bit integer" in str(e.value), str(e.value)
        assert re.search(r"line \d+\): vocab_size", str(e.value)), str(e.value)  # where it is written


@pytest.mark.parametrize("old, new, key", [
    ("batch_size = 4", "batch_size = '4'", "'train.batch_size' (line 17)"),
    ("steps = 4", "steps = 4\nlr = '0.001'", "'train.lr' (line 17)"),
    ("steps = 4", "steps = 4\n[train.early_stopping]\npatience = '3'", "'train.early_stopping.patience'"),
    ("n_layers = 1", "n_layers = '1'", "'model.n_layers' (line 14)"),
    ('models = ["transformer"]', 'models = [{ name = "transformer", d_model = "16" }]', "'sweep.models[0].d_model'"),
    ("seq_lens = [12]", "seq_lens = [12]\nseeds = ['0']", "'sweep.seeds[0]'"),
    ("seq_lens = [12]", "seq_lens = [12]\n[sweep.grid]\n\"train.batch_size\" = ['4', 8]",
     "sweep.grid 'train.batch_size' = \"4\" (line 13)"),
    ("seq_lens = [12]", "seq_lens = [12]\n[sweep.grid]\n\"model.d_model\" = ['16']", "sweep.grid 'model.d_model'"),
    ("vocab_size = 8", "vocab_size = '8'", "(line 5): vocab_size must be an integer"),
])
def test_a_quoted_number_is_refused_in_every_table(old, new, key):
    with pytest.raises(P.ProfileError) as e:
        P.loads(SMALL.replace(old, new), "p.toml")
    assert key in str(e.value), str(e.value)
    assert "integer" in str(e.value) or "number" in str(e.value)


def test_the_forms_text_inputs_still_validate():
    # the sweep form validates its inputs' text (no file, no FROM_FILE context): "4" is 4
    data = {"schema_version": 2, "name": "form", "task": {"name": "mad_selective_copying"},
            "sweep": {"models": ["transformer"]}, "train": {"steps": "4", "batch_size": "4", "lr": "0.01"}}
    prof = P.Profile.model_validate(data)
    assert (prof.train.steps, prof.train.batch_size, prof.train.lr) == (4, 4, 0.01)


def test_profile_checks_results_print_through_its_progress_line_on_a_terminal(monkeypatch):
    """On a terminal a result goes through the live progress line's console, which erases
    the line first (rich's own consoles write past its redirect of stdout: '✓ ...' started
    on the progress line); piped output is left alone."""
    import io

    from rich.console import Console

    from workbench.cli.run import _Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    with _Progress(2) as progress:
        shown = Console(file=Terminal())
        piped = Console(file=io.StringIO())
        assert progress.console(shown) is progress.bar.console
        assert progress.console(piped) is piped
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # no terminal: no line, nothing rerouted
    with _Progress(2) as progress:
        assert progress.bar is None and progress.console(shown) is shown
