"""Hugging Face Hub ids where a path is accepted: checkpoints, tokenizers and datasets.

A value names a local file or folder when one exists there (relative to where the
workbench runs), as always, or when its first part is a folder there (``data/aclImdb``
beside ``data/``: not fetched yet). Otherwise a value of the form ``owner/name``
(optionally ``hf:owner/name``, always the Hub, and ``@revision``) is a Hub repository, fetched through ``huggingface_hub``
into the standard cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else
~/.cache/huggingface/hub) with its progress bars, and the existing loaders read the
snapshot folder, as they would a folder written by ``save_pretrained``.

Offline mode (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``; for datasets also
``HF_DATASETS_OFFLINE=1``) is read when a value is resolved, not when a library was
imported: a cached snapshot is used and nothing is fetched. Anything that goes wrong
(offline and not cached, no such repository, a gated one, no network) is one line
(:class:`HubError`): what, from where, and how to work offline (the ``hf download``
command and the variables).

Shapes: nothing here touches tensors; :func:`snapshot` returns a folder path.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# owner/name[@revision]: the Hub's own rules (letters, digits, '-', '_', '.'; no '--' or
# '..'), checked loosely here; the Hub says the rest
_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?")
_NAME = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?")
PREFIX = "hf:"
HUB_EXTRA = "pip install huggingface_hub (it comes with the 'pretrained' and 'lm' extras)"
# what a checkpoint folder needs (models.pretrained): config, weights (safetensors first;
# pytorch_model.bin only when a repository has no safetensors) and the tokenizer's files
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model")
WEIGHTS_BIN = ("*.bin",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "*.model")


class HubError(ValueError):
    """A Hub id that cannot be resolved here; the message is one line: what, from where,
    and how to work offline."""


@dataclass(frozen=True)
class HubId:
    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


def _true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def offline(datasets: bool = False) -> bool:
    """Whether the Hub must not be reached: the environment now (``HF_HUB_OFFLINE``,
    ``TRANSFORMERS_OFFLINE``; ``HF_DATASETS_OFFLINE`` for datasets), or huggingface_hub's
    own setting read at its import."""
    if _true("HF_HUB_OFFLINE") or _true("TRANSFORMERS_OFFLINE") or (datasets and _true("HF_DATASETS_OFFLINE")):
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> Path:
    """The Hub cache now: ``HF_HUB_CACHE`` (or the older ``HUGGINGFACE_HUB_CACHE``), else
    ``HF_HOME``/hub, else ``XDG_CACHE_HOME``/huggingface/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.path.expanduser(os.environ[var])))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def parse(value: str) -> HubId | None:
    """The Hub id a value names, or None when it names a local path: one that exists, one
    inside a folder that exists here (``checkpoints/gpt-neo-125m`` beside a ``checkpoints/``
    folder: a folder not fetched yet, not a Hub user), or one written as a path (starting
    with '.', '/' or '~', or with more than one '/'). ``hf:owner/name`` is always the Hub."""
    if not isinstance(value, str) or not value:
        return None
    forced = value.startswith(PREFIX)
    text = value[len(PREFIX):] if forced else value
    if not forced and (text.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(text))
                       or os.path.isdir(text.split("/", 1)[0])):
        return None
    m = _ID.fullmatch(text) or (_NAME.fullmatch(text) if forced else None)  # hf:gpt2: no owner
    if m is None or "--" in m["repo"] or ".." in m["repo"]:
        return None
    return HubId(m["repo"], m["rev"])


def is_hub_id(value) -> bool:
    return isinstance(value, str) and parse(value) is not None


def download_command(hub: HubId, repo_type: str = "model") -> str:
    rev = f" --revision {hub.revision}" if hub.revision else ""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return f"hf download {hub.repo}{kind}{rev}"


def how_offline(hub: HubId, repo_type: str = "model") -> str:
    """The fix, in one clause: fetch into this cache on a connected machine, then go offline."""
    return (f"on a connected machine run `{download_command(hub, repo_type)}` (huggingface_hub < 1.0: "
            f"`huggingface-cli download ...`) with HF_HOME pointing at a cache this machine reads "
            f"(here {cache_dir()}), then set HF_HUB_OFFLINE=1; or give a local folder instead")


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = next((t.strip() for t in text if t.strip()), "")
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__


def _snapshot_download():
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise HubError(f"Hugging Face Hub ids need huggingface_hub: {HUB_EXTRA}") from None
    return snapshot_download


def cached(hub: HubId, repo_type: str = "model") -> Path | None:
    """The cached snapshot folder of ``hub`` (its revision, else the one ``refs/main``
    names), or None; never reaches the network."""
    snapshot_download = _snapshot_download()
    try:
        return Path(snapshot_download(hub.repo, repo_type=repo_type, revision=hub.revision,
                                      cache_dir=str(cache_dir()), local_files_only=True))
    except Exception:
        return None


def snapshot(value: str, what: str, repo_type: str = "model",
             patterns: tuple[str, ...] = MODEL_FILES) -> Path:
    """The local folder of ``value``: the value itself when it is a local path, else the
    Hub repository's snapshot in the standard cache (fetched when not there, unless
    offline; only the files ``patterns`` match, e.g. no TensorFlow or Flax weights).
    ``what`` names it in the one-line :class:`HubError` ("checkpoint", "tokenizer", ...)."""
    hub = parse(value)
    if hub is None:
        return Path(os.path.expanduser(value))
    snapshot_download = _snapshot_download()
    if offline(datasets=repo_type == "dataset"):
        got = cached(hub, repo_type)
        if got is None:
            raise HubError(f"{what} {hub} is not in the Hugging Face cache {cache_dir()} and offline mode "
                           f"is on (HF_HUB_OFFLINE): {how_offline(hub, repo_type)}")
        return got
    try:
        return Path(snapshot_download(hub.repo, repo_type=repo_type, revision=hub.revision,
                                      cache_dir=str(cache_dir()), allow_patterns=list(patterns)))
    except Exception as e:  # no such repository, gated, no network, disk full, ...
        local = "" if value.startswith(PREFIX) else "no local path of that name either; "
        raise HubError(f"cannot download {what} {hub} from the Hugging Face Hub ({local}"
                       f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{hub.repo}; "
                       f"{_reason(e)}): {how_offline(hub, repo_type)}") from None


def checkpoint_folder(value: str, what: str = "checkpoint") -> Path:
    """A checkpoint's folder (config, weights, tokenizer) from a local path or a Hub id;
    a repository without safetensors weights gets its ``pytorch_model.bin`` too."""
    folder = snapshot(value, what)
    if parse(value) is not None and folder.is_dir() and not any(folder.glob("*.safetensors")) \
            and not offline():
        folder = snapshot(value, what, patterns=MODEL_FILES + WEIGHTS_BIN)
    return folder
