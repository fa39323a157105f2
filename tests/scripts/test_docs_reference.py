"""docs/reference/profile.md and docs/reference/cli.md are generated from the code
(scripts/gen-reference.py: the pydantic schema of a profile, the argparse parsers); these
tests regenerate both in memory and fail while a file differs, naming the command that
rewrites it, so a new key, option or help string cannot leave the reference behind."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen-reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.mark.parametrize("which", ["profile", "cli"])
def test_reference_file_is_current(gen, which):
    path = {"profile": gen.PROFILE_MD, "cli": gen.CLI_MD}[which]
    want = {"profile": gen.profile_reference, "cli": gen.cli_reference}[which]()
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: run .venv/bin/python scripts/gen-reference.py"
    assert path.read_text() == want, (f"{path.relative_to(ROOT)} is stale: run "
                                      f".venv/bin/python scripts/gen-reference.py and commit it")


def _profile_models():
    from workbench.spec.eval_profile import EvalProfile
    from workbench.spec.schema import Profile

    seen, stack = {}, [Profile, EvalProfile]
    while stack:
        cls = stack.pop()
        if cls.__name__ in seen:
            continue
        seen[cls.__name__] = cls
        for f in cls.model_fields.values():
            todo = [f.annotation]
            while todo:
                t = todo.pop()
                if isinstance(t, type) and hasattr(t, "model_fields"):
                    stack.append(t)
                todo += list(getattr(t, "__args__", ()) or ())
                todo += list(getattr(t, "__metadata__", ()) and ())
    return seen


def test_every_profile_key_has_a_description(gen):
    missing = [f"{name}.{key}" for name, cls in _profile_models().items()
               for key in cls.model_fields if not gen.describe(cls, key)]
    assert not missing, ("keys without a description (add a comment beside the field in the schema, "
                         f"or an entry in scripts/gen-reference.py's PLAIN): {missing}")


def test_plain_descriptions_name_real_keys(gen):
    models = _profile_models()
    stale = [k for k in gen.PLAIN if k.split(".")[0] not in models
             or k.split(".", 1)[1] not in models[k.split(".")[0]].model_fields]
    assert not stale, f"PLAIN entries for keys the schema no longer has: {stale}"


def test_reference_covers_every_key_and_command(gen):
    text = gen.profile_reference()
    for name, cls in _profile_models().items():
        for key in cls.model_fields:
            assert f"| `{key}` |" in text, f"{name}.{key} is not in the profile reference"
    cli = gen.cli_reference()
    for cmd in ("run", "export", "eval", "sample", "resume", "plot", "serve", "profile check", "bench", "doctor"):
        assert f"## `ssm-workbench {cmd}`" in cli, cmd
    assert "| `--runs-per-gpu N` |" in cli and "| `--scan-backends" in cli


def test_check_fails_after_a_help_string_changes(gen, tmp_path, monkeypatch, capsys):
    """--check passes on current files and fails, naming cli.md, once a help string differs."""
    for attr, make in (("PROFILE_MD", gen.profile_reference), ("CLI_MD", gen.cli_reference)):
        copy = tmp_path / getattr(gen, attr).name
        copy.write_text(make())  # current by construction: this test is about --check itself
        monkeypatch.setattr(gen, attr, copy)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 0
    from workbench import cli

    real = cli.parser

    def changed():
        ap = real()
        sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
        fresh = next(a for a in sub.choices["run"]._actions if "--fresh" in a.option_strings)
        fresh.help = "a help string someone reworded"
        return ap

    monkeypatch.setattr(cli, "parser", changed)
    assert gen.main(["--check"]) == 1
    assert "stale: cli.md" in capsys.readouterr().out
    assert gen.main([]) == 0 and "someone reworded" in gen.CLI_MD.read_text()  # and it rewrites it
