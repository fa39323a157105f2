"""``ssm-workbench plot``: the command line of :mod:`workbench.results.plot` (argument parsing,
checks of the run selection, messages and exit codes); the figures are drawn there."""
from __future__ import annotations

import sys
from pathlib import Path

from workbench.results.curves import BANDS, X_AXES
from workbench.results.export import CannotWrite
from workbench.results.figure_base import _id_ranges, safe_stem
from workbench.results.plot import KINDS, plot_profile
from workbench.store import STATES, Store, default_store_dir
from workbench.store.progress import no_store_at


def parse_ids(text: str) -> list[int]:
    """'1,2,5-8' -> [1, 2, 5, 6, 7, 8]."""
    ids: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"bad run list {text!r}: expected ids and ranges like 1,2,5-8") from None
        if b < a:
            raise ValueError(f"bad range {part!r} in {text!r}: the end is before the start")
        ids.extend(range(a, b + 1))
    if not ids:
        raise ValueError(f"bad run list {text!r}: no ids")
    return list(dict.fromkeys(ids))


def add_parser(sub) -> None:
    """Add the ``plot`` subcommand to an argparse subparsers object."""
    p = sub.add_parser(
        "plot", help="write PNG and SVG figures (learning curves, metric vs length, eval sets, MQAR vs width, "
                     "scaling: loss vs training FLOPs with power-law fits along size)",
        description="Write matplotlib figures (PNG 150 dpi + SVG) of a profile's runs or of chosen "
                    "runs: learning curves grouped over seeds with bands, a metric against sequence "
                    "length per model, a metric against the len=N / dist=N eval sets. Each path "
                    "written is printed; figures that do not apply are listed as skipped.")
    p.add_argument("profile", nargs="?", help="profile name (the runs command lists them)")
    p.add_argument("--runs", help="run ids, e.g. 1,2,5-8 (with a profile: only those of it)")
    p.add_argument("--kind", choices=("all",) + KINDS, default="all",
                   help="which figures (default all that apply to the data)")
    p.add_argument("--metric", action="append",
                   help="metric(s), comma-separated or repeated: for curves train.NAME / eval.NAME or "
                        "a bare name (loss = train and eval); for length and eval-sets a result metric "
                        "(accuracy, step_time_ms, peak_mem_mb, ...; see `export --help`). Default: "
                        "train/eval loss and eval accuracy curves; accuracy, step_time_ms, peak_mem_mb "
                        "against length; accuracy on eval sets; loss against FLOPs for scaling "
                        "(perplexity, bits_per_byte also fit)")
    p.add_argument("--x", dest="axis", choices=X_AXES, default="step", help="curves' x axis (default step)")
    p.add_argument("--band", choices=BANDS, default="std",
                   help="spread over seeds: mean ± std, min..max, or none (default std)")
    p.add_argument("--no-group", action="store_true", help="curves: one line per run instead of per seed group")
    p.add_argument("--include-unfinished", action="store_true",
                   help="also runs that are running, failed, crashed or killed (default finished only)")
    p.add_argument("--out", help="output folder (default <store>/figures/<profile>, or "
                                 "<store>/figures/runs-<ids>, as the TUI writes them)")
    p.add_argument("--select-on", choices=["validation", "test"], default="validation",
                   help="mqar: split the best learning rate of each point is chosen on (validation, "
                        "the default; test is zoology's practice and is labelled so)")
    p.add_argument("--irreducible", action="store_true",
                   help="scaling: fit L = E + a C^-b (an irreducible loss E; 3+ points per model) "
                        "instead of L = a C^-b")
    p.add_argument("--bootstrap", type=int, default=0, metavar="B",
                   help="scaling: the exponent's uncertainty from B resamples of the points "
                        "(default 0: the fit's covariance)")
    p.set_defaults(fn=cmd_plot)


def cmd_plot(args) -> int:
    """``ssm-workbench plot``: 0 when a figure was written, 2 on bad input or nothing to plot,
    1 when a figure could not be written (a full disk; the ones written before are listed)."""
    root = Path(args.store).expanduser() if getattr(args, "store", None) else default_store_dir()
    if no_store_at(root):  # reading: say so, and make no store by looking
        print(f"no store in {root} yet: nothing to plot", file=sys.stderr)
        return 2
    store = Store(root)
    store.reap()
    try:
        run_ids = parse_ids(args.runs) if args.runs else None
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if not args.profile and not run_ids:
        print("name a profile or --runs; profiles in the store: " + (", ".join(store.profiles()) or "none"),
              file=sys.stderr)
        return 2
    if args.profile and args.profile not in store.profiles():
        print(f"no profile {args.profile!r} in {store.root}; known: " + (", ".join(store.profiles()) or "none"),
              file=sys.stderr)
        return 2
    states = STATES[1:] if args.include_unfinished else ("finished",)  # pending runs have no data
    if run_ids:
        found = {r.id: r for r in store.runs(ids=run_ids)}
        bad = [f"{i} (not in the store)" if i not in found else
               f"{i} (profile {found[i].profile})" if args.profile and found[i].profile != args.profile else
               f"{i} ({found[i].state}; add --include-unfinished)" if found[i].state not in states else None
               for i in run_ids]
        if any(bad):
            print("cannot plot run(s) " + ", ".join(b for b in bad if b), file=sys.stderr)
            return 2
    metrics = [m.strip() for ms in args.metric or [] for m in ms.split(",") if m.strip()] or None
    # the store's folder, as the TUI writes them: not the folder the command ran in (a
    # checkout would fill with figures/); absolute, so the paths printed work from anywhere
    out = (Path(args.out).expanduser() if args.out else
           store.root / "figures" / safe_stem(args.profile or f"runs-{_id_ranges(run_ids)}")).absolute()
    kinds = KINDS if args.kind == "all" else (args.kind,)
    try:
        paths, notes = plot_profile(store, args.profile, out, kinds=kinds, metrics=metrics, run_ids=run_ids,
                                    axis=args.axis, band=args.band, by_seed=not args.no_group, states=states,
                                    select_on=args.select_on,
                                    scaling_form="irreducible" if args.irreducible else "power",
                                    bootstrap=args.bootstrap)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    except CannotWrite as e:  # a full disk: one line, and no partial file left behind
        print(f"ssm-workbench: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    for n in notes:
        print(f"skipped {n}", file=sys.stderr)
    if not paths:
        print("no figure written", file=sys.stderr)
        return 2
    return 0

