"""Data and checkpoints a profile needs that are not in the repository (``[[needs]]``, and
hub ids not in the local cache while offline): which are absent, and :class:`DataAbsent`,
the error of a valid profile that cannot run until they are fetched. The profile checks
(check.py) and evaluation profiles (eval_profile.py) ask here.
"""

from __future__ import annotations

from typing import Any

from workbench.spec.schema import Profile, ProfileError


class DataAbsent(ProfileError):
    """A valid profile whose [[needs]] paths are absent: it cannot run until they are
    fetched, but nothing in it is wrong. ``profile check`` reports it as "needs data" (not
    invalid) with each ``fetch`` command; ``run`` refuses it with the same text. Everything
    that does not read those paths was checked (names, options, other tasks)."""

    def __init__(self, path: str, profile: Profile, needs: list):
        self.path, self.profile, self.needs = path, profile, needs
        lines = [f"{path}: needs data that is absent (not shipped with the repository); "
                 f"fetch it from the directory you run ssm-workbench in:"]
        for n in needs:
            what = f" ({n.what})" if n.what else ""
            lines.append(f"  {n.path}{what}: {n.fetch}")
        super().__init__("\n".join(lines))


def _norm(path: str) -> str:
    import os

    return os.path.normpath(os.path.expanduser(path))


def _refers(value: str, need: str) -> bool:
    """Whether a parameter's path ``value`` reads ``need``: the same path, a path inside it
    (a tokenizer.json in a checkpoint folder), or a folder that holds it."""
    import os

    v, n = _norm(value), _norm(need)
    return v == n or v.startswith(n + os.sep) or n.startswith(v + os.sep)


def _path_values(p: Profile) -> set[str]:
    """Every string a task parameter or a swept model's option of ``p`` can take (the
    file's values, its variants and its grid's): the paths its runs read are among them.
    (Options of models the sweep does not run, kept for a --set, read nothing.)"""
    out: set[str] = set()

    def add(v: Any) -> None:
        if isinstance(v, str) and v:
            out.add(v)
        elif isinstance(v, list):
            for x in v:
                add(x)
        elif isinstance(v, dict):
            for x in v.values():
                add(x)

    for _, t in p.task_entries():
        add(t.params())
        add(t.variants)
    swept = {c.name for c in p.sweep.model_choices()}
    for c in p.sweep.model_choices():
        add(c.options())
    add({name: opts for name, opts in p.model.options.items() if name in swept})
    for key, values in p.sweep.grid.items():
        parts = key.split(".")
        if parts[0] == "task" or (parts[:2] == ["model", "options"] and len(parts) > 2 and parts[2] in swept):
            add(values)
    return out


def absent_needs(p: Profile) -> list:
    """The profile's [[needs]] whose path is absent here and that a task parameter or model
    option still reads (a path pointed elsewhere, e.g. by --set, needs nothing). A Hugging
    Face Hub id (models/hub.py), as a need's path (written ``hf:owner/name``) or as a value
    the profile reads, is absent only where it cannot be had: offline and not in the Hugging
    Face cache (online, the run fetches it into the cache); such a value with no [[needs]]
    entry gets one here, whose fetch is the `hf download` command."""
    import os

    from workbench.spec.schema import Need

    values = _path_values(p)
    # a need's path is a Hub id only when written so (hf:owner/name): data/x.txt is a path
    out = [n for n in p.needs
           if (_hub_missing(n.path) if n.path.startswith("hf:") else not os.path.exists(_norm(n.path)))
           and any(_refers(v, n.path) or _refers("hf:" + v, n.path) for v in values)]
    from models import hub

    datasets = _task_values(p)
    for v in sorted(values):
        if _hub_id(v) and not any(_refers(v, n.path) or _refers("hf:" + v, n.path) for n in p.needs) \
                and _hub_missing(v):
            kind = "dataset" if v in datasets else "model"
            out.append(Need(path=v, fetch=hub.download_command(hub.parse(v), kind),
                            what=f"a Hugging Face Hub {kind}, not in the cache {hub.cache_dir()} (offline mode)"))
    return out


def _hub_id(value: str) -> bool:
    """A value that names a Hub repository (no local path of that name exists)."""
    from models import hub

    return hub.is_hub_id(value)


def _hub_cached(value: str) -> bool:
    """Whether a Hub id's snapshot (a model's or a dataset's) is in the cache; no network."""
    from models import hub

    ref = hub.parse(value)
    try:
        return ref is not None and any(hub.cached(ref, kind) is not None for kind in ("model", "dataset"))
    except hub.HubError:  # no huggingface_hub: nothing is cached
        return False


def _hub_missing(value: str) -> bool:
    from models import hub

    return hub.offline(datasets=True) and not _hub_cached(value)


def _task_values(p: Profile) -> set[str]:
    """The strings task parameters other than ``tokenizer`` take: a Hub id among them is a dataset."""
    out: set[str] = set()
    for _, t in p.task_entries():
        for k, v in list(t.params().items()) + list(t.variants.items()):
            if k != "tokenizer":
                out.update(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, str))
    for key, values in p.sweep.grid.items():
        if key.startswith("task.") and key != "task.tokenizer":
            out.update(x for x in values if isinstance(x, str))
    return out
