"""Validation matches what runs (issue 19, finding 6): every value that would fail at run
time, or run wrongly, is refused by ``profile check`` with a message naming the key and
its line (or the --set that gave it); files that are not UTF-8 TOML are one-line errors."""
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import models
from helpers import FULL_PROFILE
from workbench.spec import profile as P
from workbench.spec.where import _key_lines

BASE = FULL_PROFILE  # steps = 20: the warm-up cases below count on it

# (id, text replaced, replacement, what the message must name). The replacement marks the
# line the message must point at with "# <-"; every case is a value the old loader let
# through (or reported without the right line) and that then failed or ran wrongly.
CASES = [
    ("lr-inf", "lr = 1e-3", "lr = inf  # <-", "'train.lr'"),
    ("lr-nan", "lr = 1e-3", "lr = nan  # <-", "'train.lr'"),
    ("lr-1e308", "lr = 1e-3", "lr = 1e308  # <-", "'train.lr'"),
    ("lr-above-1", "lr = 1e-3", "lr = 3.0  # <-", "'train.lr'"),
    ("weight-decay-inf", "lr = 1e-3", "lr = 1e-3\nweight_decay = inf  # <-", "'train.weight_decay'"),
    ("adamw-decay-zeroes-weights", "lr = 1e-3", "lr = 0.5\nweight_decay = 4  # <-", "'train.weight_decay'"),
    ("init-std-inf", "n_layers = 2\n", "n_layers = 2\ninit_std = inf  # <-\n", "'model.init_std'"),
    ("init-std-huge", "n_layers = 2\n", "n_layers = 2\ninit_std = 50.0  # <-\n", "'model.init_std'"),
    ("betas-inf", "lr = 1e-3", "lr = 1e-3\nbetas = [0.9, inf]  # <-", "'train.betas[1]'"),
    ("min-lr-ratio-nan", "lr = 1e-3", "lr = 1e-3\nmin_lr_ratio = nan  # <-", "'train.min_lr_ratio'"),
    ("grad-clip-inf", "lr = 1e-3", "lr = 1e-3\ngrad_clip = inf  # <-", "'train.grad_clip'"),
    ("checkpoint-minutes-inf", "lr = 1e-3", "lr = 1e-3\ncheckpoint_minutes = inf  # <-",
     "'train.checkpoint_minutes'"),
    ("min-delta-inf", "patience = 2", "patience = 2\nmin_delta = inf  # <-", "'train.early_stopping.min_delta'"),
    ("target-above-1", "patience = 2", "patience = 2\ntarget = 1.5  # <-", "'train.early_stopping.target'"),
    ("patience-bool", "patience = 2", "patience = true  # <-", "'train.early_stopping.patience'"),
    ("seed-negative", "seeds = [0, 1]", "seeds = [-1]  # <-", "'sweep.seeds[0]'"),
    ("seed-2^63", "seeds = [0, 1]", "seeds = [9223372036854775808]  # <-", "'sweep.seeds[0]'"),
    ("seed-beyond-64-bits", "seeds = [0, 1]", "seeds = [0, 36893488147419103232]  # <-", "'sweep.seeds[1]'"),
    ("seeds-duplicate", "seeds = [0, 1]", "seeds = [0, 0]  # <-", "duplicate seed(s) 0"),
    ("seq-lens-duplicate", "seq_lens = [12, 16]", "seq_lens = [12, 12]  # <-", "duplicate sequence length(s) 12"),
    ("epochs-bool", "steps = 20", "epochs = true  # <-", "'train.epochs'"),
    ("steps-fraction", "steps = 20", "steps = 2.5  # <-", "'train.steps'"),
    ("batch-size-bool", "batch_size = 4", "batch_size = true  # <-", "'train.batch_size'"),
    ("warmup-1e9", "lr = 1e-3", "lr = 1e-3\nwarmup_steps = 1e9  # <-", "'train.warmup_steps'"),
    ("warmup-longer-than-steps", "lr = 1e-3", "lr = 1e-3\nwarmup_steps = 21  # <-", "'train.warmup_steps'"),
    # 64 examples / batch 4 = 16 steps an epoch: 17 warm-up steps never end
    ("warmup-longer-than-epochs", "steps = 20", "epochs = 1\nwarmup_steps = 17  # <-", "train.warmup_steps"),
    ("epochs-without-training-set", "steps = 20\n", "epochs = 2  # <-\n", "train.epochs"),
    ("amp-int", "lr = 1e-3", "lr = 1e-3\namp = 1  # <-", "'train.amp'"),
    ("compile-word", "lr = 1e-3", 'lr = 1e-3\ncompile = "no"  # <-', "'train.compile'"),
    ("tie-embeddings-yes", "n_layers = 2\n", 'n_layers = 2\ntie_embeddings = "yes"  # <-\n',
     "'model.tie_embeddings'"),
    ("slurm-requeue-yes", "[train]", '[slurm]\nrequeue = "yes"  # <-\n[train]', "'slurm.requeue'"),
    ("runs-per-gpu-zero", 'name = "tiny"', 'name = "tiny"\nruns_per_gpu = 0  # <-', "'runs_per_gpu'"),
    ("entry-d-model-zero", '{ name = "lstm", label = "lstm-3L", n_layers = 3 }]',
     '{ name = "lstm", label = "lstm-3L", n_layers = 3, d_model = 0 }]  # <-', "'sweep.models[1].d_model'"),
    ("entry-n-layers-bool", '{ name = "lstm", label = "lstm-3L", n_layers = 3 }]',
     '{ name = "lstm", label = "lstm-3L", n_layers = true }]  # <-', "'sweep.models[1].n_layers'"),
    ("task-name-not-a-string", 'name = "mad_selective_copying"', "name = 5  # <-", "'task.name'"),
    ("unknown-task-name", 'name = "mad_selective_copying"', 'name = "copy_all"  # <-', "task.name"),
    ("task-value", "num_test_examples = 16", "num_test_examples = 0  # <-", "num_test_examples"),
    ("dropout-negative", "n_heads = 2", "n_heads = 2\ndropout = -0.5  # <-",
     "model options for 'transformer'"),
    ("n-heads-word", "n_heads = 2", 'n_heads = "two"  # <-', "n_heads = 'two': expected an integer > 0"),
    ("n-heads-not-dividing", "n_heads = 2", "n_heads = 3  # <-", "n_heads=3"),
    ("mamba-d-state-negative", 'models = ["transformer", ', 'models = [\n  { name = "mamba", d_state = -1 },  # <-\n  ',
     "model options for 'mamba'"),
    ("model-option-inf", "n_heads = 2", "n_heads = 2\n[model.options.s6]\ndt_min = inf  # <-",
     "model.options.s6"),
    ("entry-init-std-inf", '{ name = "lstm", label = "lstm-3L", n_layers = 3 }]',
     '{ name = "lstm", label = "lstm-3L", init_std = inf }]  # <-', "init_std"),
]


def marked_line(text: str) -> int:
    [line] = [i for i, l in enumerate(text.splitlines(), 1) if l.rstrip().endswith("# <-")]
    return line


@pytest.mark.parametrize("old,new,named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_value_is_refused_naming_key_and_line(old, new, named):
    assert BASE.count(old) == 1, old
    text = BASE.replace(old, new)
    if named == "train.epochs":  # no training set: the selective-copying task draws fresh batches
        text = text.replace("num_train_examples = 64", "num_train_examples = 0")
    with pytest.raises(P.ProfileError) as e:
        P.loads(text, "bad.toml")
    msg = str(e.value)
    assert msg.startswith("bad.toml: invalid profile"), msg
    assert named in msg, msg
    problem = [l for l in msg.splitlines()[1:] if named in l]
    assert problem and f"(line {marked_line(text)})" in problem[0], msg


def test_values_at_the_limits_are_accepted():
    ok = (BASE.replace("seeds = [0, 1]", "seeds = [0, 9223372036854775807]")
              .replace("lr = 1e-3", "lr = 1.0\nwarmup_steps = 20")
              .replace("n_heads = 2", "n_heads = 2\ndropout = 0.0"))
    p = P.loads(ok)
    assert p.sweep.seeds == [0, 2**63 - 1] and p.train.warmup_steps == p.train.steps
    # TOML reads 1e3 as a float; an integral float is the integer it names
    assert P.loads(BASE.replace("steps = 20", "steps = 1e3")).train.steps == 1000
    # epochs with a training set: 64 examples / batch 4 = 16 steps, 16 warm-up steps fit
    assert P.loads(BASE.replace("steps = 20", "epochs = 1\nwarmup_steps = 16")).train.epochs == 1


def test_missing_key_points_at_its_table():
    text = BASE.replace('name = "mad_selective_copying"\n', "")
    with pytest.raises(P.ProfileError, match=r"missing key 'task.name' \(in the table at line 3\)"):
        P.loads(text, "bad.toml")


def test_model_option_checks_name_model_option_and_value():
    with pytest.raises(models.OptionError, match=r"model 'mamba': option d_state = -1: expected an integer > 0"):
        models.check_options("mamba", {"d_state": -1})
    for name, opts in [("transformer", {"n_heads": "two"}), ("transformer", {"dropout": -0.5}),
                       ("gated_mlp", {"dropout": 1.0}), ("gated_mlp", {"bias": "yes"}),
                       ("s6", {"dt_min": float("inf")}), ("mamba", {"dt_rank": 0}),
                       ("hyena", {"order": True})]:
        with pytest.raises(models.OptionError) as e:
            models.check_options(name, opts)
        assert e.value.option in opts and name in str(e.value)
    models.check_options("mamba", {"dt_rank": "auto", "d_inner": None, "dropout": 0})


@pytest.mark.parametrize("name", models.names())
def test_every_registry_default_passes_the_option_checks(name):
    # the checks infer each option's type from the factory; its own defaults must pass
    defaults = {k: v for k, v in models.entry(name).options().items() if v is not None}
    models.check_options(name, defaults)


# --------------------------------------------------------------------------- encodings
def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


ENCODINGS = {
    "latin-1": BASE.replace('name = "tiny"', 'name = "tiny"\ndescription = "d\u00e9j\u00e0 vu"').encode("latin-1"),
    "utf-16-bom": BASE.encode("utf-16"),
    "utf-16-no-bom": BASE.encode("utf-16-le"),
    "binary": bytes(range(256)) * 4,
    "control-chars": b"\x01\x02\x03 = 4\n",
}


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("kind", list(ENCODINGS))
def test_a_file_that_is_not_utf8_toml_is_one_line_exit_2(tmp_path, kind, command):
    f = tmp_path / f"{kind}.toml"
    f.write_bytes(ENCODINGS[kind])
    args = (["profile", "check", str(f)] if command == "check"
            else ["--store", str(tmp_path / "store"), "run", str(f)])
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and str(f) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(P.ProfileError):
        P.load(f)


def test_utf8_with_bom_is_utf8(tmp_path):
    f = tmp_path / "bom.toml"
    f.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    assert P.load(f).name == "tiny"


# --------------------------------------------------------------------------- lines and --set
def test_lines_stay_right_after_set(tmp_path):
    f = tmp_path / "p.toml"
    text = BASE.replace("lr = 1e-3", "lr = 1e-3\nlearning_rate = 3")
    f.write_text(text)
    line = text.splitlines().index("learning_rate = 3") + 1
    # an override that rewrote the text used to move every line (comments and blank
    # lines gone, tables reordered)
    with pytest.raises(P.ProfileError) as e:
        P.load(f, overrides=["train.steps=9", "sweep.seeds=[3]"])
    assert f"unknown key 'train.learning_rate' (line {line})" in str(e.value), str(e.value)


@pytest.mark.parametrize("item,named", [
    ("train.lr=inf", "'train.lr' (from --set train.lr=inf)"),
    ("sweep.seeds=[0, 0]", "'sweep.seeds' (from --set sweep.seeds=[0, 0])"),
    ("sweep.seeds=[-1]", "'sweep.seeds[0]' (from --set sweep.seeds=[-1])"),
    ("train.bogus=1", "unknown key 'train.bogus' (from --set train.bogus=1)"),
    ("model.options.transformer.n_heads=two",
     "model options for 'transformer' (from --set model.options.transformer.n_heads=two)"),
    ("task.num_test_examples=0", "(from --set task.num_test_examples=0)"),
])
def test_an_overridden_value_is_named_by_its_set(tmp_path, item, named):
    f = tmp_path / "p.toml"
    f.write_text(BASE)
    with pytest.raises(P.ProfileError) as e:
        P.load(f, overrides=[item])
    assert named in str(e.value), str(e.value)


def test_cli_names_the_set(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(BASE)
    r = cli("profile", "check", str(f), "--set", "train.amp=1")
    assert r.returncode == 2 and "'train.amp' (from --set train.amp=1)" in r.stderr, r.stderr


def leaves(data, path=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, path + (k,))
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        for i, v in enumerate(data):
            yield from leaves(v, path + (i,))
    else:
        yield path


def test_key_lines_follow_tables_in_every_shipped_profile():
    files = sorted((Path(__file__).resolve().parents[3] / "profiles").glob("*.toml"))
    assert files
    for f in files + [None]:
        text = f.read_text() if f else BASE
        lines = _key_lines(text)
        src = text.splitlines()
        for path in leaves(tomllib.loads(text)):
            assert path in lines, (f, path)
            key = [p for p in path if isinstance(p, str)][-1]
            assert key in src[lines[path] - 1], (f, path, lines[path])
