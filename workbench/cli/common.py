"""What every command of the CLI shares: the store of ``--store``, a console, number
formatting, bringing the store up to date before reading it, the state colours."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from workbench.execute import dispatch, executor
from workbench.store import StoreError, default_store_dir
from workbench.store.progress import command, no_store_at
# one table of state colours for the CLI and the TUI (the CLI modules import it from here)
from workbench.store.states import STATE_STYLES as STATE_STYLE  # noqa: F401


class NoStore(StoreError):
    """A reading command met a folder holding no store: it says so and creates nothing
    (opening a Store would make the folder and an empty database)."""

    exit_code = 1

    def __init__(self, root: Path):
        self.root = root
        super().__init__(f"no store in {root} yet: nothing has run with it "
                         f"(`{command(root)} run PROFILE.toml` creates it)")


def store_root(args) -> Path:
    """The folder of ``--store``, else the default (``$SSM_WORKBENCH_STORE``, ...)."""
    return Path(args.store).expanduser() if getattr(args, "store", None) else default_store_dir()


def _store(args, create: bool = True):
    """The store of ``--store`` (or the default). One that cannot be written here opens
    read-only, said once on stderr; one that cannot be opened at all raises StoreError,
    which :func:`main` prints as one line. ``create`` False (the reading commands): a
    folder holding no store raises :class:`NoStore` instead of becoming one."""
    from workbench.store import Store

    if not create and no_store_at(store_root(args)):
        raise NoStore(store_root(args))
    store = Store(args.store) if args.store else Store()
    if store.readonly:
        print(f"store {store.root} is read-only ({store.readonly_reason}): showing it as it is",
              file=sys.stderr)
    return store


def _console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or 160 columns when output is piped (tables
    would otherwise be squeezed to 80 and truncate run names)."""
    import shutil

    # emoji=False: run labels, model references and paths are printed as written (rich would
    # turn "run:abc:" into "run🔤"); no command prints an emoji code on purpose
    return Console(width=shutil.get_terminal_size((160, 24)).columns, stderr=stderr, emoji=False)


def _fmt(v, digits=4):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def refresh(store, runs: list | None = None) -> bool:
    """Bring the store up to date before reading it: dead local workers become crashed,
    Slurm runs get their rows ingested and their job states read (the executors' read side,
    workbench/execute/dispatch.py: nothing is submitted here). ``runs``: the rows the caller
    read after reaping, if any (light rows will do). True when an executor looked after live
    runs, so rows read before are stale. A read-only store is left as it is."""
    if runs is None:
        store.reap()
    try:
        return bool(dispatch.sync(store, runs=runs))
    except executor.ExecutorError as e:
        print(f"slurm: {e}", file=sys.stderr)
        return False


# --------------------------------------------------------------------------- commands
