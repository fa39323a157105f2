"""``ssm-workbench sample run:N|MODEL --prompt TEXT``: text from a language model, printed
token by token as it is generated (issue 42 item 2).

MODEL is what ``eval`` takes (workbench/train/eval_models.py): ``run:N``, a finished ``lm``
run of the store, read with the tokenizer kept beside its weights; or a Hugging Face causal
LM, a local folder or a hub id. It is checked as ``eval`` checks it before anything loads
(eval_cmd.checked_specs -> workbench/execute/eval_queue.py ``preflight``): a run that has
not finished is refused unless ``--allow-unfinished`` (then its last checkpoint, and the
step is said), a folder must hold whole weights and a tokenizer that fits them.

Decoding is workbench/train/decode.py's: the prompt read once, then one step per token
with the recurrent state or key/value cache carried; a model without one is run again over
its window for each token, said in one line. ``--temperature 0`` is greedy; otherwise
top-k / temperature sampling with a ``torch.Generator`` seeded by ``--seed``, so the same
seed gives the same text. Generation ends at the model's end-of-text token unless
``--ignore-eos``. A prompt longer than the model's window is refused; ``--prompt -`` reads
the prompt from stdin (less one trailing newline); an empty prompt starts from the prefix (end-of-text / BOS) token.

stdout holds the prompt and the generated text only; what was loaded and how it ended go to
stderr, one line each. Exit 2 on bad input, one line naming it.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time

INSTALL_HINT = ("sample loads models through the evaluation extra: pip install 'ssm-workbench[eval]' "
                "(or pip install 'lm-eval>=0.4')")


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return v


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {v}")
        return v
    return parse


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="text from a finished lm run or a Hugging Face checkpoint, "
                                      "streamed as it is generated")
    p.add_argument("model", metavar="run:N|MODEL",
                   help="run:N (a finished lm run of the store), a Hugging Face folder or hub id (owner/name)")
    p.add_argument("--prompt", default="", metavar="TEXT",
                   help="the text to continue ('-': read it from stdin; default empty: start from the "
                        "end-of-text / BOS token)")
    p.add_argument("--tokens", type=_int_at_least(1), default=200, metavar="N",
                   help="tokens to generate at most (default 200)")
    p.add_argument("--temperature", type=_nonneg_float, default=0.8, metavar="T",
                   help="softmax temperature; 0 = greedy (default 0.8, as nanoGPT's sample.py)")
    p.add_argument("--top-k", type=_int_at_least(0), default=200, metavar="K",
                   help="sample among the K most likely tokens (default 200; 0 = all)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the sampling generator: the same seed gives the same text (default 0)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weights' dtype for Hugging Face models (default float32)")
    p.add_argument("--max-length", type=_int_at_least(1), metavar="N",
                   help="the model's window in tokens (default: a run's training seq_len, a "
                        "checkpoint's config)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="go on past the end-of-text token (it is printed as the tokenizer writes it)")
    p.add_argument("--allow-unfinished", action="store_true",
                   help="sample a run:N that has not finished from its last checkpoint (the step is said)")
    p.set_defaults(fn=cmd_sample)


def _spec(ref: str, allow_unfinished: bool) -> dict:
    """The little of an evaluation spec that eval_queue.preflight reads."""
    return {"model": ref, "label": ref, "fields": {"model": ref},
            "eval": {"allow_unfinished": True} if allow_unfinished else {}}


def check_model(args):
    """eval's checks of ``args.model`` (module doc): the store (or None) and, for an
    unfinished run allowed, the checkpoint step loaded; a ValueError, one line a problem."""
    from workbench.cli.eval_cmd import checked_specs

    store, (spec,) = checked_specs(args, [_spec(args.model, args.allow_unfinished)], create=False)
    return store, spec["eval"].get("checkpoint_step")


def describe(lm) -> str:
    """One line: what was loaded."""
    info = lm.info
    if info.get("kind") == "workbench-run":
        step = f", step {info['step']:,}" if isinstance(info.get("step"), int) else ""
        label = f" {info['label']}" if info.get("label") and info["label"] != info.get("model") else ""
        return (f"{lm.name}{label} ({info.get('model')}, {info.get('tokenizer')} tokenizer{step}, "
                f"window {lm.max_length:,})")
    what = info.get("model_type") or info.get("kind")
    return f"{lm.name} ({what}, window {lm.max_length:,})"


def how(lm) -> str:
    from workbench.train.decode import carries_state, keeps_cache

    if carries_state(lm):
        return "key/value cache carried" if keeps_cache(lm) else "recurrent state carried"
    return (f"no state to carry ({lm.info.get('model') or lm.info.get('kind')} has no start/step): "
            f"the whole window is recomputed for every token")


def cmd_sample(args) -> int:
    if importlib.util.find_spec("lm_eval") is None:
        print(f"sample: {INSTALL_HINT}", file=sys.stderr)
        return 2
    import torch

    from workbench.train import eval_models
    from workbench.train.decode import PromptError, TextStream, decode, new_tokens, prompt_ids, stop_ids_of
    from workbench.train.measure import pick_device

    text = args.prompt
    if text == "-":  # one trailing newline (echo's, a file's last) is not part of the prompt
        text = sys.stdin.read()
        text = text[:-1] if text.endswith("\n") else text
    try:
        store, step = check_model(args)
        device = pick_device(args.device, "--device")
        lm = eval_models.load(args.model, device, store_root=store.root if store is not None else None,
                              dtype=args.dtype, max_length=args.max_length)
        ids = prompt_ids(lm, text)
    except (ValueError, PromptError) as e:  # Refused, ModelRefError, a bad device: one line each
        for line in str(e).splitlines():
            print(f"sample: {line}", file=sys.stderr)
        return 2
    if step is not None:
        print(f"sample: {args.model} has not finished: sampling its checkpoint at step {step:,}", file=sys.stderr)
    tokens, note = new_tokens(lm, len(ids), args.tokens)
    mode = "greedy" if args.temperature == 0 else (
        f"temperature {args.temperature:g}, top-k {args.top_k or 'all'}, seed {args.seed}")
    print(f"sample: {describe(lm)}; {how(lm)}; {mode}", file=sys.stderr)
    if note:
        print(f"sample: {note}", file=sys.stderr)

    stops = () if args.ignore_eos else stop_ids_of(lm)
    stream = TextStream(lambda xs: lm.decode(xs, True), context=ids)
    out = sys.stdout

    def show(tok: int) -> None:
        if tok in stops:
            return  # the end-of-text token ends the text; it is not part of it
        piece = stream.push(tok)
        if piece:
            out.write(piece)
            out.flush()

    if text:
        out.write(text)
        out.flush()
    gen = torch.Generator().manual_seed(int(args.seed))
    t0 = time.perf_counter()
    try:
        new = decode(lm, ids, tokens, temperature=args.temperature, top_k=args.top_k or None,
                     generator=gen, on_token=show, stop_ids=stops)
    except KeyboardInterrupt:
        out.write(stream.flush() + "\n")
        print("sample: interrupted", file=sys.stderr)
        return 130
    out.write(stream.flush() + "\n")
    out.flush()
    secs = time.perf_counter() - t0
    ended = "end-of-text" if new and new[-1] in stops else f"{tokens:,} tokens"
    print(f"sample: {len(new):,} tokens in {secs:.2f} s ({len(new) / max(secs, 1e-9):,.1f} tokens/s); "
          f"stopped at {ended}", file=sys.stderr)
    return 0
