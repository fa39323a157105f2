"""Datasets by Hugging Face Hub id (``stanfordnlp/imdb``, ``uoft-cs/cifar10``, a corpus),
read with the ``datasets`` library through the standard caches.

Online, ``datasets.load_dataset(id)`` does what it always does (its progress bars, the
Hub cache for the files, its own cache for the prepared Arrow tables). Offline
(``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``, read when the dataset is loaded), nothing is
fetched: a snapshot of the repository in the Hub cache (``hf download ID --repo-type
dataset`` put it there) is read as a local folder of data files by ``datasets``, else the
Arrow tables ``datasets`` prepared earlier. Any failure is one line
(:class:`models.hub.HubError`): which dataset, from where, how to work offline.
"""
from __future__ import annotations

from models import hub

DATASETS_EXTRA = "pip install 'ssm-workbench[lm]'"


def _datasets(what: str):
    try:
        import datasets
    except ImportError:
        raise hub.HubError(f"{what} from the Hugging Face Hub needs the datasets library: {DATASETS_EXTRA}") from None
    return datasets


def load(value: str, config: str | None = None, split: str | None = None, streaming: bool = False,
         what: str = "dataset"):
    """``datasets.load_dataset`` of the Hub id ``value`` (a DatasetDict, or one split with
    ``split``); ``what`` names it in errors. Raises HubError (one line)."""
    ref = hub.parse(value)
    if ref is None:
        raise hub.HubError(f"{what} {value!r} is no Hugging Face Hub id (owner/name)")
    datasets = _datasets(what)
    where = f"https://huggingface.co/datasets/{ref.repo}"
    if hub.offline(datasets=True):
        snap = hub.cached(ref, "dataset")
        if snap is not None:  # the repository's files, read as a local folder
            try:
                return datasets.load_dataset(str(snap), config, split=split, streaming=streaming)
            except Exception as e:
                raise hub.HubError(f"cannot read {what} {ref} from its snapshot {snap} ({hub._reason(e)})") from None
        if datasets.config.HF_HUB_OFFLINE:  # datasets itself is offline: the tables it prepared
            try:
                return datasets.load_dataset(ref.repo, config, split=split, streaming=streaming,
                                             revision=ref.revision)
            except Exception:  # not prepared before either: said below
                pass
        raise hub.HubError(f"{what} {ref} is not in the Hugging Face cache {hub.cache_dir()} and offline "
                           f"mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): "
                           f"{hub.how_offline(ref, 'dataset')}")
    try:
        return datasets.load_dataset(ref.repo, config, split=split, streaming=streaming,
                                     revision=ref.revision)
    except Exception as e:  # no such dataset, gated, no network, no such split or config
        local = "" if value.startswith(hub.PREFIX) else "no local path of that name either; "
        raise hub.HubError(f"cannot load {what} {ref} from the Hugging Face Hub ({local}{where}; {hub._reason(e)}): "
                           f"{hub.how_offline(ref, 'dataset')}") from None


def split_of(ds, names: tuple[str, ...], value: str, what: str):
    """The first split of ``ds`` (a DatasetDict) among ``names``; HubError naming the splits."""
    for n in names:
        if n in ds:
            return ds[n]
    raise hub.HubError(f"{what} {value} has no {' or '.join(repr(n) for n in names)} split "
                       f"(splits: {', '.join(ds)})")
