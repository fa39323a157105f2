"""Small helpers shared by the model tests."""
import time

import torch


@torch.no_grad()
def run_steps(model, x: torch.Tensor) -> torch.Tensor:
    """Feed x: (batch, length, d) through ``model.step`` one token at a time from
    ``model.init_state(batch)``; returns the stacked outputs (batch, length, d)."""
    state = model.init_state(x.shape[0])
    ys = []
    for x_t in x.unbind(1):
        y_t, state = model.step(x_t, state)
        ys.append(y_t)
    return torch.stack(ys, 1)


@torch.no_grad()
def run_pieces(model, x: torch.Tensor, sizes) -> torch.Tensor:
    """Feed x: (batch, length, d) through ``model.forward_with_state`` in consecutive pieces of
    ``sizes`` (lengths summing to length) from ``model.init_state(batch)``; returns the
    concatenated outputs (batch, length, d)."""
    state, ys = model.init_state(x.shape[0]), []
    for piece in x.split(list(sizes), dim=1):
        y, state = model.forward_with_state(piece, state)
        ys.append(y)
    return torch.cat(ys, 1)


def previous_token_accuracy(name: str, steps: int = 60, **options) -> float:
    """Train embedding + model ``name`` (one layer, width 32) + head to output the previous
    token of random sequences (vocabulary 8); returns the accuracy on fresh ones (chance 1/8).
    A model that mixes positions learns it in 60 steps; one that does not cannot."""
    import models

    torch.manual_seed(0)
    vocab, d = 8, 32
    emb = torch.nn.Embedding(vocab, d)
    m = models.build(name, d_model=d, n_layers=1, **options)
    head = torch.nn.Linear(d, vocab)
    opt = torch.optim.Adam([*emb.parameters(), *m.parameters(), *head.parameters()], lr=1e-2)
    for _ in range(steps):
        tok = torch.randint(0, vocab, (16, 12))
        logits = head(m(emb(tok)))[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tok[:, :-1].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        tok = torch.randint(0, vocab, (128, 16))
        return (head(m(emb(tok)))[:, 1:].argmax(-1) == tok[:, :-1]).float().mean().item()


SENTENCES = [
    "a wonderful film with a great story", "the acting was superb and moving",
    "a dull and boring movie", "terrible plot and awful acting", "i loved it", "i hated it",
]


def write_tokenizer(folder) -> int:
    """A word-level tokenizer trained on ``SENTENCES``, saved as folder/tokenizer.json (as
    save_pretrained writes it); returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def write_imdb(folder, per_class: int = 4) -> None:
    """An aclImdb-shaped folder: {train,test}/{pos,neg}/*.txt, one review per file."""
    for split in ("train", "test"):
        for label, words in (("pos", SENTENCES[:2] + SENTENCES[4:5]), ("neg", SENTENCES[2:4] + SENTENCES[5:])):
            d = folder / split / label
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):  # distinct reviews: a test review never equals a training one
                extra = " ".join(["i loved it" if label == "pos" else "i hated it"] * (i + 1))
                text = f"{words[i % len(words)]} {extra}" + (" the" * (split == "test"))
                (d / f"{i}_{label}.txt").write_text(text)


def write_tiny_checkpoints(root, vocab: int = 64, width: int = 16):
    """Tiny random GPT-Neo (2 layers) and Mamba (4 layers) checkpoints of one width, each with
    the word-level tokenizer, at root/gpt-neo-125m and root/mamba-130m-hf (the shipped IMDB
    profiles' folder names). Returns the two paths."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    neo, mamba = root / "gpt-neo-125m", root / "mamba-130m-hf"
    GPTNeoForCausalLM(GPTNeoConfig(
        vocab_size=vocab, hidden_size=width, num_layers=2, num_heads=2,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=1024, window_size=8,
        bos_token_id=0, eos_token_id=0)).save_pretrained(neo)
    MambaForCausalLM(MambaConfig(
        vocab_size=vocab, hidden_size=width, num_hidden_layers=4, state_size=8,
        intermediate_size=2 * width, time_step_rank=4)).save_pretrained(mamba)
    for folder in (neo, mamba):
        assert write_tokenizer(folder) <= vocab
    return neo, mamba


# ---------------------------------------------------------------------------- tiny profiles
def toml_value(v) -> str:
    """``v`` (a string, number, boolean, list or dict) as a TOML value on one line: a dict as
    an inline table, ``{ name = "lstm", n_layers = 3 }``, as a person writes a model entry."""
    import json

    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)


def tiny_profile_text(name: str = "tiny", *, schema_version: int = 1, models=("lstm",), seq_lens=(10,),
                      seeds=None, grid=None, examples=(32, 8), d_model: int = 8, n_layers: int = 1,
                      task=None, tail: str = "", **train) -> str:
    """A tiny MAD selective-copying profile (vocab 8, 2 tokens to copy: a run trains in
    seconds on a CPU) as TOML text, one key a line as a person writes it, so a test can
    still edit it with ``str.replace``. ``models``: names or dicts (inline tables); ``grid``:
    the [sweep.grid] (schema 2), {dotted key: values}; ``task``: more [task] keys (a dict);
    ``train``: the [train] keys, in order; ``tail``: TOML lines after them, as written."""
    lines = [f"schema_version = {schema_version}", f"name = {toml_value(name)}", "[task]",
             'name = "mad_selective_copying"', "vocab_size = 8", "num_tokens_to_copy = 2",
             f"num_train_examples = {examples[0]}", f"num_test_examples = {examples[1]}",
             *(f"{k} = {toml_value(v)}" for k, v in (task or {}).items()),
             "[sweep]", f"models = {toml_value(models)}", f"seq_lens = {toml_value(seq_lens)}"]
    if seeds is not None:
        lines.append(f"seeds = {toml_value(seeds)}")
    if grid:
        lines += ["[sweep.grid]", *(f"{toml_value(k)} = {toml_value(v)}" for k, v in grid.items())]
    lines += ["[model]", f"d_model = {d_model}", f"n_layers = {n_layers}", "[train]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in train.items()]
    lines += filter(None, tail.splitlines())
    return "\n".join(lines) + "\n"


# Small settings of every synthetic task (fast to generate), by task name: the tasks' own
# tests (test_tasks.py) and their splits (test_valid_split.py) build every task with them.
SMALL_TASKS = {
    "selective_copying": dict(seq_len=24, vocab_size=8, num_tokens_to_copy=4, num_test_examples=16),
    "copying": dict(seq_len=24, vocab_size=8, num_tokens_to_copy=4, num_test_examples=16),
    "mad_selective_copying": dict(seq_len=24, vocab_size=8, num_tokens_to_copy=4,
                                  num_train_examples=64, num_test_examples=16),
    "mad_copying": dict(seq_len=24, vocab_size=8, num_tokens_to_copy=4,
                        num_train_examples=64, num_test_examples=16),
    "induction_heads": dict(seq_len=32, vocab_size=8, eval_lens=[16, 32, 64],
                            num_test_examples=8, eval_token_budget=256),
    "mqar": dict(seq_len=32, vocab_size=40, num_kv_pairs=4, num_test_examples=16),
    "mad_in_context_recall": dict(seq_len=32, vocab_size=16, noise_vocab_size=2,
                                  num_train_examples=64, num_test_examples=16),
    "mad_noisy_in_context_recall": dict(seq_len=32, vocab_size=32, num_train_examples=64,
                                        num_test_examples=16),
    "mad_fuzzy_in_context_recall": dict(seq_len=48, vocab_size=16, noise_vocab_size=2,
                                        num_train_examples=32, num_test_examples=16),
    "mad_memorization": dict(seq_len=16, vocab_size=64, num_train_examples=32,
                             num_test_examples=16),
    "mad_compression": dict(seq_len=16, vocab_size=8, num_train_examples=64,
                            num_test_examples=16),
    "parity": dict(seq_len=16, min_len=4, eval_lens=[16, 32], num_test_examples=16),
    "cycle_navigation": dict(seq_len=16, min_len=4, eval_lens=[16, 32], num_test_examples=16),
    "modular_arithmetic": dict(seq_len=15, min_len=3, eval_lens=[15, 31], num_test_examples=16),
    "permutation_composition": dict(seq_len=8, eval_lens=[8, 16], num_test_examples=16),
}


# A hand-written selective-copying profile with every table a person writes: two models (one
# entry with its own label and depth), two lengths and seeds, model options and early stopping.
# Tests edit it with ``str.replace`` (each line below is unique), so keep it one key a line.
FULL_PROFILE = """\
schema_version = 1
name = "tiny"
[task]
name = "mad_selective_copying"
vocab_size = 8
num_tokens_to_copy = 2
num_train_examples = 64
num_test_examples = 16
[sweep]
models = ["transformer", { name = "lstm", label = "lstm-3L", n_layers = 3 }]
seq_lens = [12, 16]
seeds = [0, 1]
[model]
d_model = 16
n_layers = 2
[model.options.transformer]
n_heads = 2
[train]
steps = 20
batch_size = 4
lr = 1e-3
[train.early_stopping]
metric = "loss"
patience = 2
"""


def tiny_lm_corpus(folder, text: str, docs: int = 20):
    """A folder of ``docs`` short text files for the ``lm`` task: distinct documents (the
    train/valid/test split goes by a hash of each), each a numbered copy of ``text``."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True)
    for i in range(docs):
        (folder / f"d{i}.txt").write_text(f"{i} . " + text)
    return folder


def tiny_lm_profile_text(corpus, name: str, *, schema_version: int = 1, models=("mamba",), seq_len: int = 32,
                         n_layers: int = 1, num_test_examples: int = 2, head: str = "", task=None, **train) -> str:
    """A byte-level ``lm`` profile on ``corpus`` (``tiny_lm_corpus``) that trains d_model 16 for
    4 steps of batch 4 at L 32 on the CPU, evaluating once: seconds. ``head``: lines after
    the name (a recipe, an executor and its [slurm] table); ``task``: more [task] keys (a
    dict); ``train``: [train] keys over those defaults (steps, batch_size, eval_every,
    log_every, device), in order; one given as None is left out (``steps=None, tokens=320``)."""
    train = {"steps": 4, "batch_size": 4, "eval_every": 4, "log_every": 2, "device": "cpu", **train}
    lines = [f"schema_version = {schema_version}", f"name = {toml_value(name)}", *filter(None, head.splitlines()),
             "[task]", 'name = "lm"', f"source = {toml_value(str(corpus))}", 'tokenizer = "bytes"',
             "valid_fraction = 0.2", "test_fraction = 0.2", f"num_test_examples = {num_test_examples}",
             *(f"{k} = {toml_value(v)}" for k, v in (task or {}).items()), "[sweep]",
             f"models = {toml_value(models)}", f"seq_lens = [{seq_len}]", "[model]", "d_model = 16",
             f"n_layers = {n_layers}", "[train]",
             *(f"{k} = {toml_value(v)}" for k, v in train.items() if v is not None)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- real processes
def wait_for(pred, timeout=120.0, poll=0.05):
    """``pred()``'s first true value, polled every ``poll`` seconds; an AssertionError after
    ``timeout`` seconds (for workers, schedulers and jobs in processes of their own)."""

    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError("condition not reached in time")


# ---------------------------------------------------------------------------- the TUI on screen
def screen_lines(app) -> list[str]:
    """The app's screen as drawn: one string a line (what capture-pane would show)."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


def drawn_words(app, widget) -> str:
    """What the screen shows inside ``widget``'s region, its lines joined by spaces (what a
    user reads there, whatever is drawn over it)."""
    r = widget.region
    return " ".join(" ".join(line[r.x:r.right].split()) for line in screen_lines(app)[r.y:r.bottom])


async def workers_done(app) -> None:
    """Wait until no worker of ``app`` runs. A poll worker that a newer poll cancels (the
    views' exclusive polls do so under load) counts as done; a failed worker still raises.
    (Textual's ``workers.wait_for_complete`` raises WorkerCancelled for the cancelled one.)"""
    from textual.worker import WorkerCancelled

    while running := [w for w in app.workers if not w.is_finished]:
        for w in running:
            try:
                await w.wait()
            except WorkerCancelled:
                pass


async def until(pilot, cond, timeout: float = 10.0) -> None:
    """Let the app run until ``cond()`` holds: for work done by message handlers (a Select's
    Changed event mounting inputs), which one pause may not finish on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.02)


async def paste_into(pilot, selector: str, text: str) -> None:
    """Focus an input, clear it and paste ``text`` into it (one Paste event, as a terminal
    sends a paste): for long values such as paths, which typed key by key cost a keystroke's
    handling and a wait for idle per character (seconds of a test)."""
    from textual import events
    from textual.widgets import Input

    inp = pilot.app.screen.query_one(selector, Input)
    inp.focus()
    inp.value = ""
    await pilot.pause()
    inp.post_message(events.Paste(text))
    await pilot.pause()
    assert inp.value == text, (selector, inp.value, text)


async def open_form(pilot):
    """F2: the sweep form, shown; returns it."""
    from workbench.tui.sweep_form import SweepForm

    await pilot.press("f2")
    await pilot.pause()
    return pilot.app.query_one(SweepForm)


def record_frames(app, what) -> list:
    """``what(app)`` at every frame the app paints (a frame held by a batch is not painted)."""
    frames: list = []
    real = app._display

    def display(screen, renderable):
        if renderable is not None and not app._batch_count:
            frames.append(what(app))
        return real(screen, renderable)

    app._display = display
    return frames


# ---------------------------------------------- linear-RNN operators against their references
def op_state(args, seed=1):
    """A random initial state (batch, value heads, d_k, d_v) for a linear-RNN operator's args
    (q, k, v, ...) in fla's layout, requiring grad."""
    q, v = args[0], args[2]
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(q.shape[0], v.shape[2], q.shape[-1], v.shape[-1], generator=gen,
                       dtype=q.dtype).requires_grad_()


def op_outputs_and_grads(fn, args, S0, **kw):
    """o, final state and the gradients of a random functional of both w.r.t. args + S0."""
    o, s = fn(*args, initial_state=S0, output_final_state=True, **kw)
    gen = torch.Generator().manual_seed(7)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() + \
        (s * torch.randn(s.shape, generator=gen, dtype=s.dtype)).sum()
    leaves = [a for a in [*args, S0] if a is not None]
    return [o, s, *torch.autograd.grad(loss, leaves)]


def assert_results_close(got, want, atol=1e-10, rtol=1e-8):
    """Every tensor of two op_outputs_and_grads results close, naming the first that is not."""
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m: f"result {i}: {m}")


def assert_mixer_streams(m, x: torch.Tensor) -> None:
    """A streaming mixer (init_state / step / forward_with_state, state a tuple of batched
    tensors) on x (batch, L >= 5, d): step by step and in two pieces (4 + the rest) it equals
    the full forward, ends in the same state, and state_size() counts that state per batch row."""
    y = m(x)
    state, steps = m.init_state(x.shape[0]), []
    for t in range(x.shape[1]):
        y_t, state = m.step(x[:, t], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps, 1), y)
    st = m.init_state(x.shape[0])
    y1, st = m.forward_with_state(x[:, :4], st)
    y2, st = m.forward_with_state(x[:, 4:], st)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    for a, b in zip(st, state):
        torch.testing.assert_close(a, b)
    assert m.state_size() == sum(s[0].numel() for s in state)
