"""The worker's writer interface (workbench/store/writer.py): the SQLite store and a Slurm
job's run file both implement RunWriter with signatures that accept every call the protocol
allows, and the worker calls nothing on its store that the protocol lacks."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from test_curves import sweep
from workbench.store import Store, runfile
from workbench.store.writer import RunWriter

ROOT = Path(__file__).resolve().parents[3]
MEMBERS = [n for n in vars(RunWriter) if not n.startswith("_")] + list(RunWriter.__annotations__)


def protocol_methods() -> list[str]:
    return [n for n, v in vars(RunWriter).items() if not n.startswith("_") and inspect.isfunction(v)]


def accepts(impl, proto) -> str | None:
    """Why ``impl`` cannot take every call ``proto`` allows, or None."""
    have = inspect.signature(impl).parameters
    kinds = inspect.Parameter
    for name, p in inspect.signature(proto).parameters.items():
        if p.kind == kinds.VAR_KEYWORD:
            if not any(q.kind == kinds.VAR_KEYWORD for q in have.values()):
                return "no **kwargs"
            continue
        q = have.get(name)
        if q is None or q.kind != p.kind:
            return f"parameter {name!r} missing or of another kind"
        if p.default is not p.empty and q.default is q.empty:
            return f"parameter {name!r} has no default"
    for name, q in have.items():  # anything more must be optional
        if name not in inspect.signature(proto).parameters and q.default is q.empty \
                and q.kind not in (kinds.VAR_KEYWORD, kinds.VAR_POSITIONAL):
            return f"extra parameter {name!r} is required"
    return None


@pytest.mark.parametrize("impl", [Store, runfile.RunFile], ids=["Store", "RunFile"])
def test_both_writers_take_every_call_of_the_protocol(impl):
    for name in protocol_methods():
        why = accepts(getattr(impl, name), getattr(RunWriter, name))
        assert why is None, f"{impl.__name__}.{name}: {why}"


def test_instances_are_run_writers(tmp_path):
    store = Store(tmp_path / "store")
    [rid] = sweep(store, models=("lstm",), seeds=(0,))
    runfile.write_snapshot(store, rid, runfile.job_dir(tmp_path / "shared", rid))
    rf = runfile.RunFile(tmp_path / "shared", rid)
    try:
        assert isinstance(store, RunWriter) and isinstance(rf, RunWriter)
        assert rf.readonly is False and store.readonly is False
    finally:
        rf.close()


def test_the_worker_uses_only_the_protocol():
    """Every attribute the train layer reads off its store (``store.X``, ``self.store.X``) is in
    RunWriter: a new call there must be added to the protocol and to both writers."""
    used = set()
    # the whole train layer: the worker, and whatever it hands its store to (the trainer)
    nodes = [n for f in sorted((ROOT / "workbench" / "train").glob("*.py")) for n in ast.walk(ast.parse(f.read_text()))]
    for node in nodes:
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Name) and v.id == "store") or (
                    isinstance(v, ast.Attribute) and v.attr in ("store", "store_main")
                    and isinstance(v.value, ast.Name) and v.value.id == "self"):
                used.add(node.attr)
    assert {"heartbeat", "finish", "get", "root"} <= used  # the walk finds the calls
    # _refusal: only reached when readonly is True, which a run file never is
    assert used - set(MEMBERS) - {"_refusal"} == set()
