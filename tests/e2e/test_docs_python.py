"""Every ```python block in README.md, docs/*.md and docs/guide/*.md runs against today's code.

The guides show the Python API and how to add a model or a task in ```python blocks; this
test runs them so that a snippet which no longer works (a renamed function, a changed
signature) fails the suite. The commands of the ```console blocks are run by
tests/e2e/test_docs_commands.py; this file follows its shape.

How a page's blocks run: in document order, in ONE namespace (a later block may use the
names an earlier one defined), in a fresh Python process per page whose working folder is
an empty temporary one, with PYTHONPATH = the repository root, a scratch store, home, data
and Hugging Face folder, Hugging Face offline and no network (the same scratch world and
connection guard as the console commands: ``_scratch`` there), under a timeout. A block
indented under a list item is dedented. Tracebacks name the page and its line.

Markers, on the block's opening fence after ``python`` (GitHub still highlights it):

- ```python skip-run: the block is not run. Only for a block that cannot run here (it
  fetches from the hub, needs a GPU or a cluster); say why in the prose. A fragment that is
  not meant to run alone (a signature, part of a class) is rewritten so that it runs, and
  only marked where that would make the guide less clear.
- ```python slow: the block takes more than seconds; the page's test is then marked
  ``slow`` (run by ``./test.sh --slow`` and CI, not the everyday suite), as ```console slow
  blocks are.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_docs_commands import _scratch

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guide").glob("*.md"))]
MARKERS = {"skip-run", "slow"}
TIMEOUT_S = 300  # a page's whole process, generous for a loaded 2-core machine


@dataclass(frozen=True)
class Block:
    path: Path       # the page
    line: int        # of the opening fence
    source: str      # dedented
    markers: frozenset[str]

    @property
    def page(self) -> str:
        """The page relative to the repository (its file name if outside)."""
        return str(self.path.relative_to(ROOT)) if self.path.is_relative_to(ROOT) else self.path.name

    @property
    def first_line(self) -> str:
        return next((s.strip() for s in self.source.splitlines() if s.strip()), "")

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: ```python block `{self.first_line}`"


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of one page, in order (the others: any other info string)."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    fence: tuple[int, str, list[str]] | None = None  # (line, info, body)
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*```(.*)$", line)
        if m and fence is None:
            fence = (n, m.group(1).strip(), [])
        elif m and fence is not None and not m.group(1).strip():
            start, info, body = fence
            words = info.split()
            if words and words[0] == "python":
                out.append(Block(path, start, textwrap.dedent("\n".join(body)) + "\n", frozenset(words[1:])))
            fence = None
        elif fence is not None:
            fence[2].append(line)
    return out


ALL = [b for p in PAGES for b in blocks(p)]
RUN = [b for b in ALL if "skip-run" not in b.markers]


# The process a page runs in: reads the blocks (JSON) and executes them in order in one
# __main__ namespace. Each block is compiled under its page's path, padded so that its
# lines keep their numbers, so a traceback reads "File docs/guide/models.md, line 17".
# Before each block it prints "::block I"; on an exception the traceback and "::failed I".
RUNNER = r'''
import json, sys, traceback, types
blocks = json.loads(open(sys.argv[1]).read())
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
for i, b in enumerate(blocks):
    print(f"::block {i}", flush=True)
    try:
        exec(compile("\n" * b["line"] + b["source"], b["path"], "exec"), main.__dict__)
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # (not this frame)
        sys.stdout.flush()
        print(f"\n::failed {i}", flush=True)
        sys.exit(1)
print("::done", flush=True)
'''


def run_page(page_blocks: list[Block], env: dict[str, str], cwd: Path, timeout: float = TIMEOUT_S) -> list[str]:
    """Run one page's blocks in a fresh process; the failures (empty: all ran), each naming
    the page, the block's line and first line, and the output's tail."""
    cwd.mkdir(parents=True, exist_ok=True)
    spec = cwd.parent / f"{cwd.name}-blocks.json"
    spec.write_text(json.dumps([{"path": str(b.path), "line": b.line, "source": b.source}
                                for b in page_blocks]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", RUNNER, str(spec)], check=False, cwd=cwd,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        out = "".join(s.decode() if isinstance(s, bytes) else (s or "") for s in (e.stdout, e.stderr))
    elapsed = time.perf_counter() - t0
    if rc == 0 and "::done" in out:
        return []
    started = [int(i) for i in re.findall(r"^::block (\d+)$", out, re.MULTILINE)]
    failed = [int(i) for i in re.findall(r"^::failed (\d+)$", out, re.MULTILINE)]
    culprit = page_blocks[failed[-1] if failed else (started[-1] if started else 0)]
    why = (f"timed out after {timeout:.0f} s" if rc is None
           else f"raised (exit {rc}, {elapsed:.1f} s)" if failed
           else f"ended the process (exit {rc}, {elapsed:.1f} s)")
    tail = re.sub(r"^::(block|failed) \d+\n?", "", out, flags=re.MULTILINE)[-3000:]
    return [f"{culprit} {why}\n" + textwrap.indent(tail.strip("\n"), "  | ")]


def _params():
    pages: dict[str, list[Block]] = {}
    for b in RUN:
        pages.setdefault(b.page, []).append(b)
    return [pytest.param(page, marks=[pytest.mark.slow] if any("slow" in b.markers for b in bs) else [], id=page)
            for page, bs in pages.items()]


# --------------------------------------------------------------------------------- the tests
def test_docs_have_python_blocks_with_known_markers():
    """The guides hold Python to run (so the test below tests something), and every marker
    on a ```python fence is one this file knows (a typo would silently run or skip it)."""
    assert len(RUN) >= 3, [str(b) for b in ALL]
    assert {b.page for b in RUN} >= {"docs/guide/models.md", "docs/guide/tasks.md"}
    unknown = [f"{b}: {sorted(b.markers - MARKERS)}" for b in ALL if b.markers - MARKERS]
    assert not unknown, f"unknown markers on ```python fences (known: {sorted(MARKERS)}): {unknown}"


def test_a_broken_block_fails_naming_its_page_and_line(tmp_path, shared_cache):
    """The runner itself: blocks share one namespace in order (an indented one dedented),
    in the scratch world (working folder, store, no network); a block that raises is
    reported with its page, line and first line, and the ones after it do not run."""
    world = (f"import os, socket\nassert os.getcwd() == {str(tmp_path / 'ok' / 'cwd')!r}\n"
             f"assert os.environ['SSM_WORKBENCH_STORE'].startswith({str(tmp_path)!r})\n"
             "try:\n    socket.create_connection(('192.0.2.1', 443), timeout=5)\n"
             "except OSError as e:\n    assert 'refused by the docs test' in str(e), e\n"
             "else:\n    raise AssertionError('connected')\n")
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 41\n```\n\n- item\n\n  ```python\n  y = x + 1\n  assert y == 42\n"
                    "  ```\n\n```python\nz = no_such_name(y)\n```\n\n```python\nraise SystemExit('not reached')\n```\n"
                    f"\n```python skip-run\n{world}```\n")
    parsed = blocks(page)
    assert [b.first_line for b in parsed] == ["x = 41", "y = x + 1", "z = no_such_name(y)",
                                              "raise SystemExit('not reached')", "import os, socket"]
    assert [b.markers for b in parsed][-1] == {"skip-run"}
    assert run_page([*parsed[:2], parsed[-1]], _scratch(tmp_path / "ok", shared_cache), tmp_path / "ok" / "cwd") == []
    failures = run_page(parsed[:4], _scratch(tmp_path / "bad", shared_cache), tmp_path / "bad" / "cwd")
    assert len(failures) == 1, failures
    assert failures[0].startswith("page.md:14: ```python block `z = no_such_name(y)` raised"), failures[0]
    assert "NameError" in failures[0] and "not reached" not in failures[0]
    assert "line 15" in failures[0], failures[0]  # the traceback's line is the page's


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("page", _params())
def test_python_blocks_of_the_page_run(page, tmp_path, shared_cache):
    """Every ```python block of one page (but those marked skip-run), in order, in one
    namespace, in a fresh process in a scratch world without network."""
    failures = run_page([b for b in RUN if b.page == page], _scratch(tmp_path, shared_cache), tmp_path / "cwd")
    assert not failures, "\n".join(failures)
