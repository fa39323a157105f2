"""Hugging Face Hub ids for checkpoints, tokenizers and datasets (models/hub.py,
tasks/hub_data.py). Nothing here reaches the network: each test lays out a Hub cache in
tmp_path (``models--owner--name/snapshots/<revision>/...`` and ``refs/main``, as
``hf download`` leaves it), points HF_HOME there, sets offline mode, and loads by id; the
online path is checked with huggingface_hub's download function replaced."""
from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

import models  # noqa: E402
import tasks  # noqa: E402
from models import hub  # noqa: E402
from helpers import SENTENCES, write_tiny_checkpoints  # noqa: E402

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face home in tmp_path, offline."""
    home = tmp_path / "hf"
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # the libraries read these at their import, maybe before this test: never the network
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    try:
        import datasets

        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    except ImportError:
        pass
    return home


def put(home, repo: str, src, kind: str = "model"):
    """``src`` (a folder) as the cached snapshot of Hub repository ``repo`` under ``home``."""
    base = home / "hub" / f"{kind}s--{repo.replace('/', '--')}"
    shutil.copytree(src, base / "snapshots" / REV)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(REV)
    return base / "snapshots" / REV


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return write_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))  # (gpt-neo, mamba) folders


def test_ids_and_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.parse("state-spaces/mamba-130m-hf") == hub.HubId("state-spaces/mamba-130m-hf")
    assert hub.parse("hf:stanfordnlp/imdb@abc123") == hub.HubId("stanfordnlp/imdb", "abc123")
    for local in ("./a/b", "/a/b", "~/a/b", "a/b/c", "plain", "a--b/c", ""):
        assert hub.parse(local) is None, local
    assert hub.parse("data/aclImdb") == hub.HubId("data/aclImdb")  # nothing named data here
    (tmp_path / "data").mkdir()
    assert hub.parse("data/aclImdb") is None  # inside a folder here: a folder not fetched yet
    (tmp_path / "data" / "aclImdb").mkdir()
    assert hub.parse("data/aclImdb") is None  # a folder that exists here is a folder
    assert hub.parse("hf:data/aclImdb") == hub.HubId("data/aclImdb")  # unless the Hub is asked for


def test_a_pretrained_mamba_loads_by_hub_id_from_the_cache(hf_home, checkpoints):
    _, mamba = checkpoints
    put(hf_home, "org/tiny-mamba", mamba)
    by_id = models.build("pretrained_mamba", d_model=1, n_layers=1, path="org/tiny-mamba")
    local = models.build("pretrained_mamba", d_model=1, n_layers=1, path=str(mamba))
    assert by_id.checkpoint == "org/tiny-mamba"
    x = torch.randn(2, 5, by_id.d_model)
    torch.testing.assert_close(by_id(x), local(x), rtol=0, atol=0)  # the same weights, the same code
    put(hf_home, "org/tiny-neo", checkpoints[0])
    neo = models.build("pretrained_causal_lm", d_model=1, n_layers=1, path="hf:org/tiny-neo")
    assert neo.checkpoint == "hf:org/tiny-neo" and neo.model_type == "gpt_neo"


def test_an_id_that_is_not_cached_offline_is_one_line(hf_home, checkpoints):
    with pytest.raises(hub.HubError) as e:
        models.build("pretrained_mamba", d_model=1, n_layers=1, path="state-spaces/mamba-130m-hf")
    msg = str(e.value)
    assert "\n" not in msg
    assert "state-spaces/mamba-130m-hf is not in the Hugging Face cache" in msg
    assert str(hf_home / "hub") in msg and "HF_HUB_OFFLINE" in msg
    assert "`hf download state-spaces/mamba-130m-hf`" in msg
    with pytest.raises(hub.HubError, match="`hf download stanfordnlp/imdb --repo-type dataset`"):
        tasks.build("text_classification", data_path="stanfordnlp/imdb", tokenizer=str(checkpoints[0]))


def test_online_fetches_into_the_standard_cache_or_says_why_not_in_one_line(hf_home, checkpoints, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def fetched(repo_id, **kw):  # what a download leaves: the snapshot folder
        calls.append((repo_id, kw))
        if kw.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        if repo_id != "org/m":
            raise OSError(f"404 Client Error: Repository Not Found for url: https://huggingface.co/{repo_id}")
        return str(put(hf_home, repo_id, checkpoints[1]))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetched)
    stack = models.build("pretrained_mamba", d_model=1, n_layers=1, path="org/m")
    assert stack.checkpoint == "org/m"
    repo, kw = calls[0]
    assert repo == "org/m" and kw["cache_dir"] == str(hf_home / "hub") and not kw.get("local_files_only")
    assert "*.safetensors" in kw["allow_patterns"] and "*.h5" not in kw["allow_patterns"]
    with pytest.raises(hub.HubError) as e:
        models.build("pretrained_mamba", d_model=1, n_layers=1, path="org/absent")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cannot download Mamba checkpoint org/absent from the Hugging Face Hub")
    assert "https://huggingface.co/org/absent" in msg and "OSError: 404 Client Error: Repository Not Found" in msg
    assert "`hf download org/absent`" in msg and "HF_HUB_OFFLINE=1" in msg


def test_a_dataset_that_cannot_be_loaded_online_is_one_line(hf_home, monkeypatch):
    datasets = pytest.importorskip("datasets")
    from tasks import hub_data

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked = []

    def load_dataset(path, name=None, **kw):  # what datasets says when the Hub is unreachable
        asked.append((path, name, kw))
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(hub.HubError) as e:
        hub_data.load("stanfordnlp/imdb@main", what="text_classification dataset")
    msg = str(e.value)
    assert asked == [("stanfordnlp/imdb", None, {"split": None, "streaming": False, "revision": "main"})]
    assert "\n" not in msg and msg.startswith("cannot load text_classification dataset stanfordnlp/imdb@main")
    assert "https://huggingface.co/datasets/stanfordnlp/imdb" in msg and "ConnectionError: Couldn't reach" in msg
    assert "`hf download stanfordnlp/imdb --repo-type dataset --revision main`" in msg


def _jsonl(folder, rows):
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _reviews(split):
    word = "great" if split == "train" else "awful"  # no test review equals a training one
    return [{"text": f"{s} " + " ".join([word] * (i + 1)), "label": i % 2} for i, s in enumerate(SENTENCES * 2)]


def test_text_classification_reads_a_hub_dataset_and_tokenizer_by_id(hf_home, checkpoints, tmp_path):
    pytest.importorskip("datasets")
    data = tmp_path / "imdb-like"
    for split in ("train", "test"):  # the Hub's layout: plain_text/<split>-00000-of-00001.*
        _jsonl(data / "plain_text" / f"{split}-00000-of-00001.jsonl", _reviews(split))
        _jsonl(tmp_path / "files" / f"{split}.jsonl", _reviews(split))
    put(hf_home, "org/tiny-imdb", data, kind="dataset")
    put(hf_home, "org/tiny-neo", checkpoints[0])
    kw = dict(seq_len=12, num_train_examples=8, num_test_examples=4)
    by_id = tasks.build("text_classification", data_path="org/tiny-imdb", tokenizer="org/tiny-neo", **kw)
    local = tasks.build("text_classification", data_path=str(tmp_path / "files"),
                        tokenizer=str(checkpoints[0]), **kw)
    assert by_id.layout == "hub" and by_id.label_names == [0, 1]
    for a, b in zip(by_id.sample(4, seed=1), local.sample(4, seed=1)):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    ev_a, ev_b = by_id.eval_sets(0)[""], local.eval_sets(0)[""]
    assert torch.equal(torch.as_tensor(ev_a.inputs), torch.as_tensor(ev_b.inputs))


def test_cifar10_by_hub_id_equals_the_pickle_folder(hf_home, tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (30, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, 30)
    folder = tmp_path / "pickles"
    folder.mkdir()
    parts = {f"data_batch_{i}": slice(4 * (i - 1), 4 * i) for i in range(1, 6)} | {"test_batch": slice(20, 30)}
    for name, sl in parts.items():  # the python-pickle layout: (n, 3072) channel-major rows
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": x[sl].transpose(0, 3, 1, 2).reshape(-1, 3072), b"labels": list(y[sl])}, f)
    repo = tmp_path / "cifar-like" / "plain_text"
    repo.mkdir(parents=True)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    for split, sl in (("train", slice(0, 20)), ("test", slice(20, 30))):
        ds = datasets.Dataset.from_dict({"img": [Image.fromarray(a) for a in x[sl]], "label": y[sl].tolist()},
                                        features=features)
        ds.to_parquet(str(repo / f"{split}-00000-of-00001.parquet"))
    put(hf_home, "org/tiny-cifar", tmp_path / "cifar-like", kind="dataset")
    by_id = tasks.build("sequential_image", path="org/tiny-cifar")
    local = tasks.build("sequential_image", path=str(folder))
    for a, b in zip(by_id._cifar, local._cifar):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(by_id._cifar[0], x[:20])


def test_an_lm_corpus_by_hub_id(hf_home, tmp_path):
    pytest.importorskip("datasets")
    from tasks.lm.sources import Source

    rows = [{"text": f"document {i}: " + " ".join(SENTENCES[: i % 5 + 1])} for i in range(7)]
    _jsonl(tmp_path / "corpus" / "data" / "train-00000-of-00001.jsonl", rows)
    put(hf_home, "org/tiny-corpus", tmp_path / "corpus", kind="dataset")
    docs = list(Source("hf:org/tiny-corpus").documents())
    assert ["".join(d.pieces()) for d in docs] == [r["text"] for r in rows]
    with pytest.raises(hub.HubError, match=r"^lm corpus org/absent is not in the Hugging Face cache"):
        list(Source("hf:org/absent").documents())


PROFILE = """
schema_version = 1
name = "hub"
[task]
name = "text_classification"
data_path = "{data}"
tokenizer = "{tok}"
num_train_examples = 8
num_test_examples = 4
[sweep]
models = [{{ name = "pretrained_mamba", path = "{model}", train_mode = "freeze" }}]
seq_lens = [12]
[train]
steps = 2
batch_size = 4
device = "cpu"
"""


def test_profile_check_counts_cached_hub_ids_as_present(hf_home, checkpoints, tmp_path, capsys):
    pytest.importorskip("datasets")
    from workbench.cli import main

    data = tmp_path / "imdb-like"
    for split in ("train", "test"):
        _jsonl(data / "plain_text" / f"{split}-00000-of-00001.jsonl", _reviews(split))
    put(hf_home, "org/tiny-imdb", data, kind="dataset")
    put(hf_home, "org/tiny-mamba", checkpoints[1])
    good = tmp_path / "good.toml"
    good.write_text(PROFILE.format(data="org/tiny-imdb", tok="org/tiny-mamba", model="org/tiny-mamba"))
    assert main(["profile", "check", str(good)]) == 0, capsys.readouterr()
    capsys.readouterr()
    bad = tmp_path / "bad.toml"
    bad.write_text(PROFILE.format(data="stanfordnlp/imdb", tok="org/tiny-mamba", model="state-spaces/mamba-130m-hf"))
    code = main(["profile", "check", str(bad)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 0 and "needs data" in text  # not invalid: fetched, it runs (`run` refuses it until then)
    assert "hf download stanfordnlp/imdb --repo-type dataset" in text
    assert "hf download state-spaces/mamba-130m-hf" in text


def test_a_tokenizer_without_tokenizer_json_is_converted_like_autotokenizer(hf_home, tmp_path):
    """EleutherAI/gpt-neo-125m's repository holds vocab.json + merges.txt, no tokenizer.json:
    by Hub id it tokenises as the same tokenizer saved as tokenizer.json does."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

    from tasks.text_classification import load_tokenizer

    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    fast.mkdir(), slow.mkdir()
    tok.save(str(fast / "tokenizer.json"))
    tok.model.save(str(slow))  # vocab.json + merges.txt
    config = json.dumps({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>",
                         "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"})
    for folder in (fast, slow):
        (folder / "tokenizer_config.json").write_text(config)
    put(hf_home, "org/slow-tok", slow)
    want, want_pad = load_tokenizer(str(fast))
    got, pad = load_tokenizer("org/slow-tok")
    assert pad == want_pad == 0  # <|endoftext|>
    for text in SENTENCES + ["an unseen wörd, with punctuation!"]:
        assert got.encode(text).ids == want.encode(text).ids, text


def test_the_lm_task_takes_a_pretrained_tokenizer_by_hub_id(hf_home, checkpoints):
    from tasks.lm.tokenizer import pretrained_file

    snap = put(hf_home, "org/tiny-neo", checkpoints[0])
    assert pretrained_file("org/tiny-neo") == str(snap / "tokenizer.json")
    with pytest.raises(hub.HubError, match=r"^lm tokenizer org/absent is not in the Hugging Face cache"):
        pretrained_file("org/absent")
