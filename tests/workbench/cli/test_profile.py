"""Profiles: round trip, sweep expansion, and every kind of bad input named precisely."""
import importlib.util

import pytest

from helpers import FULL_PROFILE
from workbench.spec import profile as P

GOOD = FULL_PROFILE


def test_round_trip_and_expand(tmp_path):
    p = P.loads(GOOD, "good.toml")
    path = P.save(p, tmp_path / "again.toml")
    q = P.load(path)
    assert q == p
    specs = P.expand(q)
    assert len(specs) == 2 * 2 * 2
    lstm = [s for s in specs if s.model == "lstm"]
    assert {s.n_layers for s in lstm} == {3} and {s.label for s in lstm} == {"lstm-3L"}
    tr = [s for s in specs if s.model == "transformer"][0]
    assert tr.model_options == {"n_heads": 2} and tr.n_layers == 2
    assert {s.task_params["seq_len"] for s in specs} == {12, 16}
    assert tr.train.early_stopping.patience == 2


def bad(text: str) -> str:
    with pytest.raises(P.ProfileError) as e:
        P.loads(text, "bad.toml")
    msg = str(e.value)
    assert msg.startswith("bad.toml"), msg
    return msg


def test_unknown_key_named_with_line():
    msg = bad(GOOD.replace("lr = 1e-3", "lr = 1e-3\nlearning_rate = 3"))
    assert "train.learning_rate" in msg
    line = GOOD.replace("lr = 1e-3", "lr = 1e-3\nlearning_rate = 3").splitlines().index("learning_rate = 3") + 1
    assert f"line {line}" in msg


def test_unknown_top_level_section():
    assert "unknown key 'optimizer'" in bad(GOOD + "\n[optimizer]\nx = 1\n")


def test_wrong_type():
    msg = bad(GOOD.replace("batch_size = 4", 'batch_size = "four"'))
    assert "train.batch_size" in msg and "four" in msg


def test_out_of_range_and_budget():
    assert "train.lr" in bad(GOOD.replace("lr = 1e-3", "lr = -1.0"))
    assert "exactly one of train.epochs or train.steps" in bad(GOOD.replace("steps = 20", "steps = 20\nepochs = 2"))


def test_unknown_model_and_task_and_options():
    assert "unknown model 'mamba9'" in bad(GOOD.replace('"transformer",', '"mamba9",'))
    assert "unknown task 'copy_all'" in bad(GOOD.replace('name = "mad_selective_copying"', 'name = "copy_all"'))
    assert "num_kv" in bad(GOOD.replace("vocab_size = 8", "vocab_size = 8\nnum_kv = 3"))
    assert "n_head" in bad(GOOD.replace("n_heads = 2", "n_head = 2"))
    assert "seq_lens" in bad(GOOD.replace("vocab_size = 8", "vocab_size = 8\nseq_len = 3"))


def test_model_option_values_checked_before_any_run():
    # the backbone is built on the meta device at check time: bad values, not just bad names
    msg = bad(GOOD.replace("n_heads = 2", "n_heads = 3"))
    assert "model options for 'transformer'" in msg and "n_heads=3" in msg
    msg = bad(GOOD.replace('"transformer",', '{ name = "mamba", d_inner = 0 },'))
    assert "d_inner = 0: expected an integer > 0" in msg  # models.check_options, before building
    P.loads(GOOD.replace('"transformer",', '"s4_dplr",'))  # meta-only limitations are not errors


def test_malformed_toml_names_line():
    msg = bad(GOOD.replace("lr = 1e-3", "lr = = 1e-3"))
    assert "malformed TOML" in msg and "line" in msg


def test_schema_version():
    assert "schema_version" in bad(GOOD.replace("schema_version = 1", "schema_version = 7"))


def test_cli_check_exit_codes(tmp_path, capsys):
    # the command's main in this process (`python -m workbench` exits with what it returns):
    # a process per call cost an interpreter, torch and a cold estimate probe each
    from workbench import cli

    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    broken = tmp_path / "broken.toml"
    broken.write_text(GOOD.replace("batch_size = 4", "batch_size = 4\nbatchsize = 4"))
    assert cli.main(["profile", "check", str(good)]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert cli.main(["profile", "check", str(broken)]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "batchsize" in err


def test_shipped_profiles_are_valid(tmp_path, monkeypatch):
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[3] / "profiles").glob("*.toml"))
    assert files, "no shipped profiles"
    # the char-LM profile reads data/tinyshakespeare.txt relative to the working directory;
    # the repository ships no data, so give it a small text of our own
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tinyshakespeare.txt").write_text("To be, or not to be: that is the question.\n" * 400)
    # the IMDB profiles read data/aclImdb and checkpoints/{gpt-neo-125m,mamba-130m-hf}: tiny ones
    pretrained = importlib.util.find_spec("transformers") is not None
    if pretrained:
        from helpers import write_imdb, write_tiny_checkpoints

        # 400 training reviews: imdb-lora's 250 warm-up steps (batch 1, one epoch) must fit
        # in the run, which the check now computes from the training set it reads
        write_imdb(tmp_path / "data" / "aclImdb", per_class=200)
        write_tiny_checkpoints(tmp_path / "checkpoints")
    monkeypatch.chdir(tmp_path)
    for f in files:
        if f.name.startswith("imdb-") and not pretrained:
            continue  # the optional 'pretrained' extra is not installed
        P.load(f)


def test_task_values_checked_before_any_run():
    # 2 tokens to copy need seq_len >= 5: the profile is refused, naming the length
    msg = bad(GOOD.replace("seq_lens = [12, 16]", "seq_lens = [4, 16]"))
    assert "seq_len=4" in msg
    char = GOOD.replace('name = "mad_selective_copying"', 'name = "char_lm"')
    char = "\n".join(l for l in char.splitlines() if not l.startswith(("vocab_size", "num_tokens", "num_train")))
    assert "path" in bad(char)


def test_set_overrides_apply_before_validation(tmp_path):
    src = tmp_path / "p.toml"
    src.write_text(GOOD)
    p = P.load(src, overrides=["train.steps=9", "model.options.lstm.norm=layer",
                               'sweep.seeds=[3]', "task.num_test_examples=8"])
    assert p.train.steps == 9 and p.sweep.seeds == [3] and p.task.params()["num_test_examples"] == 8
    assert p.model.options["lstm"] == {"norm": "layer"}          # bare word -> string
    with pytest.raises(P.ProfileError, match="dotted.key=value"):
        P.load(src, overrides=["train.steps"])
    with pytest.raises(P.ProfileError, match="train.bogus|bogus"):
        P.load(src, overrides=["train.bogus=1"])                  # still strictly validated
