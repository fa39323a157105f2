"""Every command in README.md and docs/guide/*.md runs, against a scratch store.

The docs mark the commands a reader types as ```console blocks, one ``$ `` line per command
(a trailing backslash continues it). A block opened as ```console runs in the everyday
group: its commands need nothing before them and take seconds (listings, checks, dry runs).
A block opened as ```console slow holds commands that train, download or start processes;
they run, with the everyday ones, page by page in document order in the ``slow`` test.

Each page gets a fresh store, home, data and cache folder (the user's ~/.local/share, ~/.cache
and Hugging Face cache are never read), Hugging Face offline, and no network: every Python
process the commands start imports a ``sitecustomize`` that refuses connections to anything
but the loopback (tests/e2e/test_docs_commands.py writes it), and the in-process commands run
under the same guard. A command that would train for minutes, or needs the network or a
GPU, is run as its REDUCED form from :data:`OVERRIDES` (fewer seeds, epochs, examples; a
local tiny checkpoint for a hub id; ``--dry-run`` where only a download is left), so
what is checked is that the command, its options and the files it names work as typed.
A command the machine cannot run at all (Slurm's without a cluster) is reported as skipped.
"""
from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent

# The mad-selective-copying profile cut to seconds: one seed, one epoch, 200 examples.
MAD_SMALL = '--set "sweep.seeds=[0]" --set train.epochs=1 --set task.num_train_examples=200'
# An lm profile cut to seconds: a small corpus (this repository's workbench/ Python
# files, not the 31 MB standard library), a BPE of 512 ids, a few steps.
LM_SMALL = ("--set 'task.source={root}/workbench/**/*.py' --set task.vocab_size=512 "
            '--set train.warmup_steps=0 --set train.batch_size=4')
# ... and its budget: steps, or tokens per parameter for a profile whose budget that is
LM_STEPS = "--set train.steps=4"
LM_TPP = "--set train.tokens_per_param=0.1"

# Command as written in the docs -> what the test runs instead (a shell command; {root},
# {tmp} and {ckpt} are filled in), or TUI for the TUI (run headless under Textual's Pilot).
TUI = "<tui>"
OVERRIDES: dict[str, str] = {
    # the main job and the tests: reduced; the tests run one small file (./test.sh itself
    # runs this file's everyday test, so running the whole suite here would recurse)
    "./run.sh run profiles/mad-selective-copying.toml":
        f"./run.sh run profiles/mad-selective-copying.toml {MAD_SMALL} --quiet",
    "./test.sh": "SSM_WORKBENCH_TEST_JOBS=0 ./test.sh tests/scripts/test_docs_reference.py -q",
    "ssm-workbench": TUI,
    "ssm-workbench run profiles/mad-selective-copying.toml":
        f"ssm-workbench run profiles/mad-selective-copying.toml {MAD_SMALL} --quiet",
    "ssm-workbench run profiles/mad-selective-copying.toml --quiet":
        f"ssm-workbench run profiles/mad-selective-copying.toml {MAD_SMALL} --quiet",
    "ssm-workbench run profiles/mad-selective-copying.toml --jobs 2":
        f"ssm-workbench run profiles/mad-selective-copying.toml {MAD_SMALL} --jobs 2 --quiet",
    "ssm-workbench run profiles/mad-selective-copying.toml --set train.devices=2 --jobs 2":
        f"ssm-workbench run profiles/mad-selective-copying.toml {MAD_SMALL} --set train.devices=2 --jobs 2 --quiet",
    "ssm-workbench run --executor slurm profiles/mad-selective-copying.toml":
        f"ssm-workbench run --executor slurm profiles/mad-selective-copying.toml {MAD_SMALL} "
        "--set slurm.gpus_per_run=0 --set slurm.cpus_per_run=1 --fresh --quiet",  # the test cluster has no GPU
    "ssm-workbench run profiles/grid-example.toml":
        "ssm-workbench run profiles/grid-example.toml --set \"sweep.seeds=[0]\" --set train.epochs=1 "
        "--set task.num_train_examples=64 --set task.num_test_examples=16 "
        "--set 'sweep.grid={\"train.lr\" = [1e-3], \"train.weight_decay\" = [0.0, 0.1]}' --quiet",
    "ssm-workbench run profiles/mad-benchmark-reduced.toml":
        "ssm-workbench run profiles/mad-benchmark-reduced.toml --set train.epochs=1 "
        "--set 'sweep.grid={\"train.lr\" = [1e-3]}' --quiet",
    # the file's expansion expects its full grid and epochs; the reduced runs are scored by
    # the profile's name in the store (score takes either)
    "ssm-workbench score profiles/mad-benchmark-reduced.toml":
        "ssm-workbench score mad-benchmark-reduced --allow-partial",
    "ssm-workbench run profiles/mqar-grid-reduced.toml":
        "ssm-workbench run profiles/mqar-grid-reduced.toml --set train.epochs=1 "
        "--set task.num_train_examples=64 --quiet",
    "ssm-workbench run profiles/lm-stdlib-tiny.toml":
        f"ssm-workbench run profiles/lm-stdlib-tiny.toml {LM_SMALL} {LM_STEPS} --quiet",
    "ssm-workbench run profiles/lm-scaling-reduced.toml":
        f"ssm-workbench run profiles/lm-scaling-reduced.toml {LM_SMALL} {LM_TPP} --quiet",
    "SSM_WORKBENCH_THREADS=1 ssm-workbench run profiles/lm-scaling-reduced.toml":
        f"SSM_WORKBENCH_THREADS=1 ssm-workbench run profiles/lm-scaling-reduced.toml {LM_SMALL} {LM_TPP} --quiet",
    # hub ids need the network: the same command on two tiny local checkpoints and the
    # guide's own task of your own (its YAML, written by the test with a local data file)
    "ssm-workbench eval state-spaces/mamba-130m-hf EleutherAI/pythia-160m --tasks lambada_openai,hellaswag --limit 20":
        "ssm-workbench eval {ckpt}/mamba-130m-hf {ckpt}/gpt-neo-125m --include {tmp}/my-tasks --tasks my_task "
        "--limit 4 --batch-size 2",
    "ssm-workbench eval state-spaces/mamba-130m-hf --tasks lambada_openai --limit 20":
        "ssm-workbench eval state-spaces/mamba-130m-hf --tasks lambada_openai --limit 20 --dry-run",
    "ssm-workbench run profiles/imdb-mamba-frozen.toml --set task.data_path=/data/aclImdb "
    "--set model.options.pretrained_mamba.path=/ckpt/mamba-130m-hf --set task.tokenizer=/ckpt/mamba-130m-hf":
        "ssm-workbench run profiles/imdb-mamba-frozen.toml --set task.data_path={tmp}/aclImdb "
        "--set model.options.pretrained_mamba.path={ckpt}/mamba-130m-hf --set task.tokenizer={ckpt}/mamba-130m-hf "
        "--quiet",
}


# Commands whose outcome here is a refusal by design: the test machine is offline, so a
# profile of hub checkpoints must be refused with the commands that fetch them (exit 2);
# a run that finished is not resumed.
EXPECT: dict[str, tuple[int, str]] = {
    "ssm-workbench run profiles/zero-shot-table3.toml --dry-run":
        (2, "hf download state-spaces/mamba-130m-hf"),
    "ssm-workbench run profiles/zero-shot-table3.toml": (2, "hf download state-spaces/mamba-130m-hf"),
    # the store guide's runs have all finished by then (the reduced run takes seconds), so
    # `kill 2` says it had already ended and `resume 2` refuses: a finished run is never redone
    "ssm-workbench resume 2": (2, "is finished; nothing to resume"),
}


def _outcome(c: Command, rc: int, out: str) -> bool:
    want_rc, want_text = EXPECT.get(c.text, (0, ""))
    return rc == want_rc and want_text in out


@dataclass(frozen=True)
class Command:
    page: str        # relative to the repository
    line: int        # of the $ line
    text: str        # as written (continuations joined)
    slow: bool

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: $ {self.text}"


def commands(path: Path) -> list[Command]:
    """The ``$`` lines of the ```console blocks of one page, in order."""
    out: list[Command] = []
    lines = path.read_text().splitlines()
    fence, slow, i = None, False, 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*```(\S*)(.*)$", line)
        if m and fence is None:
            fence = m.group(1) or "text"
            slow = "slow" in m.group(2).split()
        elif m and fence is not None and not m.group(1):
            fence = None
        elif fence == "console" and line.lstrip().startswith("$ "):
            start, text = i + 1, line.lstrip()[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            out.append(Command(str(path.relative_to(ROOT)), start, text.strip(), slow))
        i += 1
    return out


ALL = [c for p in PAGES for c in commands(p)]


# --------------------------------------------------------------------------- the scratch world
NO_NETWORK = '''\
"""Written by tests/e2e/test_docs_commands.py: no connection leaves this machine."""
import socket as _s

_connect = _s.socket.connect


def _guard(self, address):
    if self.family in (_s.AF_INET, _s.AF_INET6):
        host = str(address[0])
        if host not in ("127.0.0.1", "::1", "localhost", "0.0.0.0"):
            raise OSError(f"network access refused by the docs test: {address!r}")
    return _connect(self, address)


_s.socket.connect = _guard
'''


def _scratch(tmp: Path, shared_cache: Path) -> dict[str, str]:
    """The environment of a page: a fresh store, home and data folder, the session's cache
    (probes, compiled kernels, lm-eval's task index), offline, no network."""
    from models.kernels import cpu_kernels

    guard = tmp / "no-network"
    guard.mkdir(parents=True, exist_ok=True)
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home), "SSM_WORKBENCH_STORE": str(tmp / "store"), "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(shared_cache), "SSM_WORKBENCH_KERNEL_CACHE": str(cpu_kernels.cache_dir()),
        "SSM_WORKBENCH_DATA": str(tmp / "lm-data"), "HF_HOME": str(tmp / "hf"),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
        "PYTHONPATH": os.pathsep.join([str(guard), str(ROOT)]),
        "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]),
        "COLUMNS": "160", "OMP_WAIT_POLICY": "PASSIVE",
    }


def _fill(text: str, tmp: Path) -> str:
    # (str.replace, not format: the overrides hold TOML inline tables in braces)
    return text.replace("{root}", str(ROOT)).replace("{tmp}", str(tmp)).replace("{ckpt}", str(tmp / "ckpt"))


def _my_task(tmp: Path) -> None:
    """evaluation.md's own YAML task, with its data file in ``tmp``: a few documents."""
    import yaml

    page = (ROOT / "docs" / "guide" / "evaluation.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", page, re.DOTALL).group(1)
    folder = tmp / "my-tasks"
    folder.mkdir(exist_ok=True)
    docs = folder / "docs.jsonl"
    docs.write_text("".join(f'{{"text": "a wonderful film with a great story number {i}"}}\n' for i in range(6)))
    spec = yaml.safe_load(block)
    spec["dataset_kwargs"]["data_files"]["test"] = str(docs)
    (folder / "my_task.yaml").write_text(yaml.safe_dump(spec))


def _tiny_data(tmp: Path) -> None:
    from helpers import write_imdb, write_tiny_checkpoints

    (tmp / "ckpt").mkdir(exist_ok=True)
    write_tiny_checkpoints(tmp / "ckpt")
    write_imdb(tmp / "aclImdb")
    _my_task(tmp)


def _tui(env: dict[str, str], monkeypatch) -> tuple[int, str]:
    """``ssm-workbench`` through the real entry point, the app run headless: it opens on
    the store, the runs table is there, ``q`` quits."""
    import asyncio

    from workbench import cli
    from workbench.tui.app import WorkbenchApp

    seen: list[str] = []

    def headless(self):
        async def drive():
            async with self.run_test(size=(120, 40)) as pilot:
                await pilot.pause(0.5)
                seen.append(type(self.screen).__name__)
                await pilot.press("q")
        asyncio.run(drive())

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(WorkbenchApp, "run", headless)
    rc = cli.main([])
    return rc, f"screens: {seen}"


def _guard_network(monkeypatch) -> None:
    real = socket.socket.connect

    def guard(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and str(address[0]) not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network access refused by the docs test: {address!r}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", guard)


def _in_process(argv: list[str], env: dict[str, str], monkeypatch, capsys) -> tuple[int, str]:
    """``ssm-workbench ARGV`` in this process (an interpreter and torch imported once for
    all the quick commands), under the page's environment."""
    from workbench import cli

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse: --help, bad arguments
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out = capsys.readouterr()
    return rc, out.out + out.err


def _shell(cmd: str, env: dict[str, str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(["bash", "-c", cmd], check=False, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def _slurm_reason() -> str | None:
    from slurm_cluster import unavailable_reason

    return unavailable_reason()


# --------------------------------------------------------------------------------- the tests
def test_docs_mark_their_commands():
    """The docs hold commands to run (so the tests below test something), every ``$`` line
    sits in a console block, and every override still names a command of the docs."""
    assert len([c for c in ALL if not c.slow]) >= 10 and len([c for c in ALL if c.slow]) >= 10
    for page in PAGES:
        fence = None
        for n, line in enumerate(page.read_text().splitlines(), 1):
            m = re.match(r"^\s*```(\S*)", line)
            if m:
                fence = (m.group(1) or "text") if fence is None else None
            elif line.lstrip().startswith("$ ") and fence != "console":
                pytest.fail(f"{page.relative_to(ROOT)}:{n}: a $ command outside a ```console block")
    texts = {c.text for c in ALL}
    stale = [k for k in [*OVERRIDES, *EXPECT] if k not in texts]
    assert not stale, f"OVERRIDES for commands no page has any more: {stale}"


def test_every_registry_model_is_in_the_readme_models_table():
    import models

    table = (ROOT / "README.md").read_text().split("## Models", 1)[1]
    names = set(re.findall(r"`([a-z0-9_]+)`", table))
    grid = re.search(r"`\{h3,mamba,none\}_\{([a-z0-9_,]+)\}`", table)
    names |= {f"{a}_{b}" for a in ("h3", "mamba", "none") for b in grid.group(1).split(",")}
    missing = [n for n in models.names() if n not in names]
    assert not missing, f"registry entries missing from README.md's models table: {missing}"


def test_commands_cannot_reach_the_network(tmp_path, shared_cache):
    """The guard every command runs under: a Python process started with the page's
    environment cannot open a connection off this machine (the loopback stays open)."""
    env = _scratch(tmp_path, shared_cache)
    rc, out = _shell(f"{sys.executable} -c \"import socket; socket.create_connection(('192.0.2.1', 443), timeout=5)\"",
                     env, timeout=60)
    assert rc != 0 and "network access refused by the docs test" in out, out
    assert env["HF_HUB_OFFLINE"] == "1" and env["SSM_WORKBENCH_STORE"].startswith(str(tmp_path))


def test_quick_commands(tmp_path, shared_cache, monkeypatch, capsys):
    """The everyday ```console blocks, page by page, each page in a fresh scratch world.
    ``ssm-workbench`` commands run in this process (seconds each); others through bash."""
    _guard_network(monkeypatch)
    failures, by_page = [], {}
    for c in ALL:
        if not c.slow:
            by_page.setdefault(c.page, []).append(c)
    assert by_page
    for i, (page, cmds) in enumerate(by_page.items()):
        env = _scratch(tmp_path / f"page{i}", shared_cache)
        for c in cmds:
            text = _fill(OVERRIDES.get(c.text, c.text), tmp_path / f"page{i}")
            argv, t0 = shlex.split(text), time.perf_counter()
            if text == TUI:
                rc, out = _tui(env, monkeypatch)
            elif argv[0] == "ssm-workbench":
                rc, out = _in_process(argv[1:], env, monkeypatch, capsys)
            else:
                rc, out = _shell(text, env, timeout=300)
            if not _outcome(c, rc, out):
                failures.append(f"{c}\n  ran: {text}\n  exit {rc} after {time.perf_counter() - t0:.1f} s\n"
                                + textwrap.indent(out[-2000:], "  | "))
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_every_command_of_the_page(page, tmp_path, shared_cache, request, monkeypatch, capsys):
    """Every command of one page, in document order, in a fresh scratch world (so a page's
    commands may use what its earlier ones made: `export` after `run`), the long ones
    REDUCED as OVERRIDES says. Slurm's run on the test cluster where there is one."""
    _guard_network(monkeypatch)
    failures, skipped = [], []
    env = _scratch(tmp_path, shared_cache)
    cmds = [c for c in ALL if c.page == page]
    if any("{tmp}" in OVERRIDES.get(c.text, "") or "{ckpt}" in OVERRIDES.get(c.text, "") for c in cmds):
        _tiny_data(tmp_path)
    for c in cmds:
        text, t0 = _fill(OVERRIDES.get(c.text, c.text), tmp_path), time.perf_counter()
        if "--executor slurm" in text:
            reason = _slurm_reason()
            if reason:
                skipped.append(f"{c} ({reason})")
                continue
            cluster = request.getfixturevalue("slurm_env")
            env = {**env, **cluster.env}
        if text == TUI:
            rc, out = _tui(env, monkeypatch)
        else:
            rc, out = _shell(text, env, timeout=900)
        if not _outcome(c, rc, out):
            failures.append(f"{c}\n  ran: {text}\n  exit {rc}\n" + textwrap.indent(out[-3000:], "  | "))
        sys.__stderr__.write(f"{time.perf_counter() - t0:6.1f} s  {c}\n")
    if skipped:
        print("skipped:\n" + "\n".join(skipped))
    assert not failures, "\n".join(failures)
