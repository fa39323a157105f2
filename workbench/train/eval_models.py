"""The models ``ssm-workbench eval`` scores, as :class:`LoadedLM` (lm_eval_adapter.py).

A model reference is one of

- ``run:N``: run N of the store, an ``lm``-task run: its spec rebuilds the composed model
  (workbench/train/compose.py), its tokenizer is the one kept beside its weights (never
  fitted again: a BPE refit on an edited corpus gives other ids), its weights come
  from ``checkpoints/N/weights.pt`` (what a finished ``lm`` run keeps) or, for a run that
  stopped before its end, its resumable checkpoint ``last.pt``;
- a Hugging Face causal LM: a local folder (``save_pretrained``'s files) or a hub id
  (``owner/name[@revision]``, fetched into the standard Hugging Face cache by
  models/hub.py, which honours ``HF_HUB_OFFLINE`` and ``HF_HOME``). Mamba checkpoints (``model_type =
  "mamba"``) run on the workbench's own Mamba (models/pretrained.py; it matches
  ``transformers``' to 5e-7) and generate from its recurrent state; any other runs through
  ``transformers``' ``AutoModelForCausalLM`` and generates from its own cache, passed by the
  keyword its ``forward`` takes (:func:`cache_keyword`: ``cache`` in transformers 5.x,
  ``past_key_values`` / ``cache_params`` before; an unknown keyword would vanish into
  ``**kwargs`` and every step would run without state). Generation ends at the generation
  config's ``eos_token_id`` (what ``model.generate`` stops at). The tokenizer is the
  folder's, through ``transformers``' ``AutoTokenizer``, called as the harness's ``hf``
  model calls it.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.train.lm_eval_adapter import LoadedLM

DEFAULT_MAX_LENGTH = 2048  # the harness's hf default where neither config nor tokenizer says


class ModelRefError(ValueError):
    """A model reference that cannot be loaded; the message is one line saying why."""


def load(ref: str, device: torch.device, *, store_root: str | Path | None = None,
         dtype: str = "float32", max_length: int | None = None, backend: str = "auto",
         source: dict | None = None) -> LoadedLM:
    """The model ``ref`` names (module doc) on ``device``, in eval mode. ``source``: for
    ``run:N``, what :func:`run_source` read from the store when the evaluation was submitted
    (a Slurm job opens no store), else it is read from ``store_root`` now."""
    if ref.startswith("run:"):
        run_id = run_id_of(ref)
        if store_root is None and source is None:
            raise ModelRefError(f"model {ref!r} needs a store")
        return load_run(store_root, run_id, device, max_length=max_length, source=source)
    return load_hf(ref, device, dtype=dtype, max_length=max_length, backend=backend)


# ------------------------------------------------------------------ Hugging Face models
def resolve_folder(ref: str) -> Path:
    """A local folder as it is; else a Hub id fetched into (or found in) the standard
    Hugging Face cache by models/hub.py (offline mode, one-line errors)."""
    from models.hub import HubError, checkpoint_folder, parse

    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if parse(ref) is None:
        raise ModelRefError(f"model {ref!r}: no such folder, and not a hub id (owner/name) nor run:N")
    try:
        return checkpoint_folder(ref, "model")
    except HubError as e:
        raise ModelRefError(str(e)) from None


def _hf_tokenizer(folder: Path):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise ModelRefError(f"{folder}: no usable tokenizer ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None


def _hf_text(tok) -> tuple:
    """encode / decode / eot / prefix as the harness's hf model uses a tokenizer."""
    from lm_eval.models.utils import has_bos_prefix

    if tok.eos_token_id is None:
        raise ModelRefError("the tokenizer has no end-of-text token (eos_token), which lm-eval's "
                            "rolling log-likelihood and empty contexts need")
    eot = int(tok.eos_token_id)
    prefix = int(tok.bos_token_id) if tok.bos_token_id is not None else eot
    bos_text = tok.decode(prefix)

    def encode(text: str, add_special_tokens: bool | None = None) -> list[int]:
        kw = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if add_special_tokens is None and has_bos_prefix(text, bos_text):
            kw["add_special_tokens"] = False  # the text brings its BOS already
        return tok.encode(text, **kw)

    def decode(ids: list[int], skip_special: bool = True) -> str:
        return tok.decode(ids, skip_special_tokens=skip_special)

    return encode, decode, eot, prefix


# the names transformers' causal LMs have given their cache argument, newest first
CACHE_KEYWORDS = ("cache", "past_key_values", "cache_params")


def cache_keyword(model) -> str | None:
    """The keyword ``model.forward`` takes its cache by (read from its signature, so a
    renamed argument is noticed instead of being swallowed by ``**kwargs``), or None."""
    params = inspect.signature(model.forward).parameters
    return next((k for k in CACHE_KEYWORDS if k in params), None)


def _returned_cache(out, keyword: str, what: str):
    """The cache a forward returned (under ``keyword`` or a name of CACHE_KEYWORDS)."""
    for name in (keyword, *CACHE_KEYWORDS):
        if name in out.keys():
            return out[name]
    raise ModelRefError(f"{what} returned no cache (its output has {', '.join(out.keys())}): "
                        "generation cannot carry its state")


def _generation_config(folder: Path, cfg):
    """What ``model.generate`` decodes by: generation_config.json, else derived from config.json."""
    from transformers import GenerationConfig
    try:
        return GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    except OSError:  # no generation_config.json: generate derives it from config.json
        return GenerationConfig.from_model_config(cfg)


# Settings of a generation config that change what ``model.generate(do_sample=False)``
# picks (lm-eval's hf model passes none of them, so the checkpoint's own apply), with the
# value that changes nothing: the workbench's greedy decoder applies none of them, so a
# checkpoint that sets one is refused for generation rather than answered differently.
GREEDY_NEUTRAL = {
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "num_beams": 1, "num_beam_groups": 1,
    "diversity_penalty": 0.0, "penalty_alpha": 0.0, "min_length": 0, "min_new_tokens": 0,
    "bad_words_ids": [], "suppress_tokens": [], "begin_suppress_tokens": [], "sequence_bias": {},
    "forced_bos_token_id": None, "forced_eos_token_id": None, "exponential_decay_length_penalty": None,
    "guidance_scale": 1.0,
}


def greedy_changes(gen) -> tuple[str, ...]:
    """``name = value`` for each setting of the generation config ``gen`` that makes
    ``model.generate``'s greedy tokens differ from the plain argmax (GREEDY_NEUTRAL)."""
    out = []
    for name, neutral in GREEDY_NEUTRAL.items():
        value = getattr(gen, name, None)
        if value is not None and value != neutral and not (neutral in ([], {}) and not value):
            out.append(f"{name} = {value!r}")
    return tuple(out)


def _eos_ids(folder: Path, cfg, eot: int, generation_config=None) -> tuple[int, ...]:
    """The ids ``model.generate`` stops after: the generation config's ``eos_token_id``
    (generation_config.json, else the model config's), else the tokenizer's EOS."""
    gen = generation_config if generation_config is not None else _generation_config(folder, cfg)
    ids = getattr(gen, "eos_token_id", None)
    if ids is None:
        return (eot,)
    return tuple(int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids]))


def _max_length(cfg, tok, max_length: int | None) -> int:
    if max_length:
        return int(max_length)
    from lm_eval.models.utils import resolve_max_length
    return int(resolve_max_length(cfg, tok, default=DEFAULT_MAX_LENGTH))


def load_hf(ref: str, device: torch.device, *, dtype: str = "float32", max_length: int | None = None,
            backend: str = "auto") -> LoadedLM:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ModelRefError("Hugging Face models need transformers: pip install 'ssm-workbench[pretrained]'") from None
    from transformers import AutoConfig

    folder = resolve_folder(ref)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ModelRefError(f"dtype {dtype!r}: expected float32, bfloat16 or float16")
    cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    tok = _hf_tokenizer(folder)
    encode, decode, eot, prefix = _hf_text(tok)
    common = dict(name=ref, encode=encode, decode=decode, eot_id=eot, prefix_id=prefix,
                  max_length=_max_length(cfg, tok, max_length), device=device)
    if getattr(cfg, "model_type", None) == "mamba":
        gen = _generation_config(folder, cfg)
        return _workbench_mamba(folder, device, torch_dtype, backend,
                                dict(common, eos_ids=_eos_ids(folder, cfg, eot, gen), greedy_changes=greedy_changes(gen)))
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch_dtype)
    model.to(device).eval()

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return model(ids).logits

    keyword, what = cache_keyword(model), f"{type(model).__name__}.forward"
    positions = "cache_position" in inspect.signature(model.forward).parameters  # transformers 4.x

    def start(ids: torch.Tensor):
        if keyword is None:  # refused, not recomputed without state
            import transformers
            raise ModelRefError(
                f"{what} (transformers {transformers.__version__}) takes none of the cache keywords "
                f"{', '.join(CACHE_KEYWORDS)}: the workbench cannot carry its state through generation; "
                "use a transformers version the workbench knows (see pyproject.toml)")
        kw = {"cache_position": torch.arange(ids.shape[1], device=ids.device)} if positions else {}
        out = model(ids, use_cache=True, **kw)
        return out.logits[:, -1], (_returned_cache(out, keyword, what), ids.shape[1])

    def step(tok_t: torch.Tensor, state):
        cache, seen = state
        kw = {"cache_position": torch.tensor([seen], device=tok_t.device)} if positions else {}
        out = model(tok_t[:, None], use_cache=True, **{keyword: cache}, **kw)
        return out.logits[:, -1], (_returned_cache(out, keyword, what), seen + 1)

    return LoadedLM(logits=logits, start=start, step=step, **common,
                    eos_ids=_eos_ids(folder, cfg, eot, model.generation_config),
                    greedy_changes=greedy_changes(model.generation_config),
                    info={"kind": "transformers", "model_type": cfg.model_type, "folder": str(folder),
                          "cache_keyword": keyword, "params": sum(p.numel() for p in model.parameters())})


def _workbench_mamba(folder: Path, device, torch_dtype, backend: str, common: dict) -> LoadedLM:
    """A Mamba -hf checkpoint on the workbench's Mamba (models/pretrained.py), head = lm_head
    (tied to the embedding in the published checkpoints)."""
    from models.pretrained import load_state_dict, mamba_from_checkpoint

    stack = mamba_from_checkpoint(folder, backend=backend)
    sd = load_state_dict(folder)
    emb = stack.token_embedding
    stack.to(device=device, dtype=torch_dtype).eval()
    own = sd.get("lm_head.weight")  # absent or equal to the embedding: tied
    weight = own.to(device=device, dtype=torch_dtype) if own is not None else None

    def head_of(y: torch.Tensor) -> torch.Tensor:
        return F.linear(y, weight if weight is not None else emb.weight)

    def logits(ids):
        return head_of(stack(emb(ids)))

    def start(ids):
        y, state = stack.forward_with_state(emb(ids), stack.init_state(ids.shape[0]))
        return head_of(y[:, -1]), state

    def step(tok_t, state):
        y, state = stack.step(emb(tok_t), state)
        return head_of(y), state

    return LoadedLM(logits=logits, start=start, step=step, **common,
                    info={"kind": "workbench-mamba", "backend": getattr(stack.layers[0].mixer, "backend", backend),
                          "folder": str(folder), "params": sum(p.numel() for p in stack.parameters())})


# ------------------------------------------------------------------ workbench runs
def run_id_of(ref: str) -> int:
    try:
        return int(ref[4:])
    except ValueError:
        raise ModelRefError(f"model {ref!r}: expected run:N with N a run id") from None


def run_source(store_root: str | Path, run_id: int) -> dict:
    """What evaluating run ``run_id`` needs from the store, read once: its spec, label and
    state, and the folder its checkpoints are in (a Slurm-trained run's shared folder). A
    Slurm evaluation gets this in its info when submitted, so its job opens no SQLite store
    (which must not be read over a network filesystem). A ModelRefError when the run is
    absent or no language model."""
    from workbench.store import Store

    reader = Store(store_root, readonly=True)  # the run to load, read once (not a worker's writer)
    try:
        r = reader.get(run_id)
    finally:
        reader.close()
    if r is None:
        raise ModelRefError(f"model run:{run_id}: no such run in {store_root}")
    if r.spec.get("kind") == "eval" or r.task != "lm":
        raise ModelRefError(f"model run:{run_id}: a {r.spec.get('kind', r.task)!r} run; only runs of the "
                            "lm task are language models lm-eval can score")
    # a run trained by a Slurm job keeps its checkpoints in the job's shared folder
    # (workbench.execute.slurm.files_root, read here from the info: train/ sits below execute/)
    files = (r.info or {}).get("slurm_shared") or str(store_root)
    # what it trained on (info "data", tasks/lm/fingerprint.py) and when it was queued: a run
    # without a kept tokenizer is rebuilt only while its corpus is what it was (_run_tokenizer)
    return {"run_id": run_id, "spec": r.spec, "label": r.label, "state": r.state, "files_root": str(files),
            "data": (r.info or {}).get("data"), "created": r.created}


def _run_tokenizer(src: dict, root, run_id: int, task):
    """The tokenizer run ``run_id`` trained with: the one kept beside its weights
    (workbench/train/checkpoint.py save_tokenizer), never fitted again. A run that kept none
    (trained before tokenizers were kept) has it rebuilt from its corpus only while the
    corpus is what the run trained on (its recorded fingerprint, or else no file of the
    corpus modified since the run was queued); otherwise a ModelRefError saying so."""
    from tasks.lm import fingerprint
    from tasks.lm import tokenizer as toks
    from workbench.train import checkpoint

    where = checkpoint.tokenizer_folder(root, run_id)
    if toks.saved(str(where)):
        try:
            return toks.load_saved(str(where)), "kept"
        except ValueError as e:
            raise ModelRefError(f"model run:{run_id}: {e}") from None
    params = src["spec"].get("task_params") or {}
    try:
        why = fingerprint.changed(params, src.get("data"))
        if why is None and not (src.get("data") or {}).get("fingerprint") and src.get("created"):
            newer = fingerprint.newer_files(params, float(src["created"]))
            if newer:
                why = (f"the corpus {params.get('source', 'stdlib')!r} changed since the run trained "
                       f"({len(newer)} file(s) modified after it was queued, e.g. {newer[0]})")
    except (OSError, ValueError) as e:
        why = f"its corpus cannot be read ({str(e).splitlines()[0]})"
    if why:
        raise ModelRefError(f"model run:{run_id} kept no tokenizer (trained before runs kept one) and {why}: "
                            "a tokenizer rebuilt now would not be the one its weights learned")
    return task.tokenizer, "rebuilt"


def load_run(store_root: str | Path | None, run_id: int, device: torch.device, *,
             max_length: int | None = None, source: dict | None = None) -> LoadedLM:
    import tasks
    from workbench.spec.run_spec import RunSpec
    from workbench.train import checkpoint
    from workbench.train.compose import build_model

    src = source if source is not None else run_source(store_root, run_id)
    root = src["files_root"]
    spec = RunSpec.from_dict(src["spec"])
    weights, last = checkpoint.weights_path(root, run_id), checkpoint.path_for(root, run_id)
    path = weights if weights.is_file() else last if last.is_file() else None
    if path is None:
        raise ModelRefError(f"model run:{run_id} ({src['state']}) has no weights in the store: a finished lm "
                            f"run keeps {weights}; runs finished before this version kept none")
    try:
        state = checkpoint.load(path, run_id, src["spec"])
    except checkpoint.CheckpointError as e:
        raise ModelRefError(f"model run:{run_id}: {e}") from None
    task = tasks.build(spec.task, **spec.task_params)
    tok, tok_from = _run_tokenizer(src, root, run_id, task)
    task._tok = tok  # the model's vocabulary (a char tokenizer's size) is the kept tokenizer's too
    model = build_model(task, spec.model, d_model=spec.d_model, n_layers=spec.n_layers, **spec.model_options)
    model.load_state_dict(state["model"])
    model.to(device).eval()
    bb = model.backbone
    streams = all(hasattr(bb, m) for m in ("init_state", "forward_with_state", "step"))
    # what decoding carries: the Transformer's key/value cache (positions up to its window, as a
    # transformers model's; decode.new_tokens) or a fixed-size recurrent state
    carried = (("key/value cache" if callable(getattr(bb, "state_size", None)) and bb.state_size() is None
                else "recurrent state") if streams else None)

    def start(ids):
        y, st = bb.forward_with_state(model.encoder(ids), bb.init_state(ids.shape[0]))
        return model.head(y[:, -1:])[:, -1], st

    def step(tok_t, st):
        y, st = bb.step(model.encoder(tok_t[:, None])[:, 0], st)
        return model.head(y[:, None])[:, 0], st

    return LoadedLM(
        name=f"run:{run_id}", logits=lambda ids: model(ids),
        encode=lambda text, add_special_tokens=None: [int(i) for i in tok.encode(text)],
        decode=lambda ids, skip_special=True: tok.decode(ids),
        eot_id=int(tok.eot_id), prefix_id=int(tok.eot_id),
        max_length=int(max_length or spec.seq_len or DEFAULT_MAX_LENGTH), device=device,
        start=start if streams else None, step=step if streams else None,
        info={"kind": "workbench-run", "run_id": run_id, "model": spec.model, "label": src["label"],
              "weights": str(path), "step": state.get("step"), "tokenizer": tok.kind, "tokenizer_from": tok_from,
              "carries": carried,
              "params": sum(p.numel() for p in model.parameters())})
