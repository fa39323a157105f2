"""Decoding text from a :class:`~workbench.train.lm_eval_adapter.LoadedLM`, one token at a
time: what ``ssm-workbench sample`` (workbench/cli/sample.py), the run view's sample modal
(workbench/tui/sample_screen.py) and ``bench --generate`` run.

:func:`decode` reads the prompt once and then costs one token per step where the model can
carry its state (``LoadedLM.start`` / ``step``: a recurrent state for the workbench's
Mamba-like backbones, the key/value cache of a ``transformers`` model); a model without
them (the workbench's Transformer) is run again over its last ``max_length`` tokens for
every new token, as nanoGPT's ``sample.py`` crops its context. The next token is the
argmax at temperature 0 (greedy), else a draw from the softmax of the logits divided by
the temperature, restricted to the ``top_k`` largest logits, drawn by ``torch.multinomial``
with the caller's ``torch.Generator`` on the CPU (so one seed gives the same text on any
device). Decoding stops after an end-of-text token (``LoadedLM.eos_ids``, else its
``eot_id``; ``stop_ids=()`` never stops) or after ``max_new`` tokens.

:func:`prompt_ids` turns the prompt into ids (an empty prompt is the model's prefix token;
one longer than the model's window is refused: its first tokens would be outside what the
model was trained to see), :func:`new_tokens` caps the budget where a cache has positions
(a ``transformers`` model's window) and :class:`TextStream` turns the ids into text as they
come, holding back a character whose bytes are not all generated yet.

:func:`greedy_steps` is the batched loop ``bench --generate`` times: greedy steps with no
host synchronisation (the argmax stays on the device, no ``.item()`` or branch on a value),
so on CUDA the host queues steps while the device works; :func:`graphed_step` replays a
fixed-size recurrent state's step from one CUDA graph on CUDA (one launch per token) and
leaves every other case, and the CPU, as they are. :func:`decode` reads each token on the
host because it streams them (``on_token``) and stops at a stop id.

This module imports no lm-eval: ``LoadedLM`` is only a type here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

import torch

if TYPE_CHECKING:  # pragma: no cover
    from workbench.train.lm_eval_adapter import LoadedLM


class PromptError(ValueError):
    """A prompt that cannot be decoded from; the message is one line."""


def carries_state(lm: "LoadedLM") -> bool:
    """Whether ``lm`` reads its prompt once and then steps token by token (start/step)."""
    return lm.start is not None and lm.step is not None


def stop_ids_of(lm: "LoadedLM") -> tuple[int, ...]:
    """The ids after which generation ends: ``lm.eos_ids`` (what ``model.generate`` stops
    at), else the model's end-of-text token."""
    return tuple(lm.eos_ids) if lm.eos_ids is not None else (int(lm.eot_id),)


def prompt_ids(lm: "LoadedLM", text: str) -> list[int]:
    """``text`` as the ids decoding starts from: the tokenizer's encoding (a Hugging Face
    tokenizer adds its BOS as it is configured to), the prefix token alone for an empty
    text; a :class:`PromptError` when it is longer than the model's window."""
    ids = [int(i) for i in lm.encode(text, None)] if text else []
    if not ids:
        ids = [int(lm.prefix_id)]
    if len(ids) > lm.max_length:
        raise PromptError(f"the prompt is {len(ids):,} tokens, longer than {lm.name}'s window of "
                          f"{lm.max_length:,} tokens: shorten it (its first tokens would be outside "
                          "what the model was trained to see)")
    return ids


def keeps_cache(lm: "LoadedLM") -> bool:
    """Whether ``lm`` decodes with a key/value cache (a ``transformers`` model, the
    workbench's Transformer: ``info["carries"]``) rather than a fixed-size recurrent state."""
    return carries_state(lm) and (lm.info.get("kind") == "transformers"
                                  or lm.info.get("carries") == "key/value cache")


def new_tokens(lm: "LoadedLM", n_prompt: int, wanted: int) -> tuple[int, str | None]:
    """(tokens to generate, a one-line note or None). A key/value cache has positions up
    to the model's window (a learned position table ends there; the workbench's
    Transformer was trained on that many), so prompt + tokens is kept within
    ``max_length``; a recurrent state has no such end, and recomputation slides the window."""
    if keeps_cache(lm) and n_prompt + wanted > lm.max_length:
        room = max(lm.max_length - n_prompt, 0)
        return room, (f"{wanted:,} tokens after a {n_prompt:,}-token prompt pass {lm.name}'s window of "
                      f"{lm.max_length:,} tokens: generating {room:,}")
    return wanted, None


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row. logits float (batch, vocab) -> long (batch,), on the
    logits' device. Temperature 0: the argmax. Else a draw (``torch.multinomial``, one
    sample, on the CPU with ``generator``) from softmax(logits / temperature) over the
    ``top_k`` largest logits (None or 0: all)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, not {temperature}")
    if temperature == 0:
        return logits.argmax(-1)
    x = logits.float() / float(temperature)                          # (batch, vocab)
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, int(top_k), dim=-1).values[..., -1:]     # (batch, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1).cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


def greedy_steps(step: Callable, tok: torch.Tensor, state, n: int, out: torch.Tensor | None = None,
                 clock=None):
    """``n`` greedy decoding steps for a batch, with no host synchronisation: each step is
    ``logits, state = step(tok, state)`` then ``tok = next_token(logits)`` (the argmax, on
    the device), the tokens written into ``out`` (batch, >= n) long when given. ``clock``
    (a :class:`workbench.train.measure.StepClock`) times each step (CUDA events on a GPU,
    read after the loop). No ``.item()``, ``.cpu()`` or branch on a tensor's value inside
    the loop: on CUDA the host queues step after step while the device works. Returns
    (last tok (batch,), last logits, state)."""
    logits = None
    for i in range(n):
        if clock is not None:
            clock.start()
        logits, state = step(tok, state)
        tok = next_token(logits)
        if clock is not None:
            clock.stop()
        if out is not None:
            out[:, i] = tok
    return tok, logits, state


def state_leaves(state) -> list[torch.Tensor] | None:
    """The tensors of a decoding state that is only nested lists / tuples / dicts of
    tensors (a fixed-size recurrent state), in a fixed order; None when it holds anything
    else (a KVCache object, an int counter): such a state changes in ways a CUDA graph
    cannot replay."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        items = [state[k] for k in sorted(state)]
    elif isinstance(state, (list, tuple)):
        items = list(state)
    else:
        return None
    out: list[torch.Tensor] = []
    for item in items:
        leaves = state_leaves(item)
        if leaves is None:
            return None
        out.extend(leaves)
    return out


def same_layout(a: list[torch.Tensor], b: list[torch.Tensor] | None) -> bool:
    """Whether two states' tensors have the same count, shapes, dtypes and devices."""
    return b is not None and len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and x.device == y.device for x, y in zip(a, b))


class GraphedStep:
    """A decoding step replayed from one CUDA graph (``device.type == "cuda"`` only).

    Built by :func:`graphed_step` for a state whose tensors keep their shapes from step to
    step (a recurrent state): the step is captured once on static buffers (the token and
    the state), with the new state copied back into the state's buffers inside the graph,
    so each token is one graph launch instead of one kernel launch per operation (what
    dominates decoding at small widths). Called as the step it replaces: ``(tok, state)
    -> (logits, state)``; the logits and state returned are the graph's static buffers
    (valid until the next call)."""

    def __init__(self, step: Callable, tok: torch.Tensor, state, warmup: int = 2):
        self.tok = tok.clone()
        self.leaves = [t.clone() for t in state_leaves(state)]
        self.state = _rebuild(state, iter(self.leaves))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):       # warm-up off the capture (lazy inits, autotuning),
            for _ in range(warmup):         # on a copy: a step may update its state in place
                step(self.tok, _copy(state))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            logits, new = step(self.tok, self.state)
            for dst, src in zip(self.leaves, state_leaves(new)):
                dst.copy_(src)
        self.logits = logits

    def __call__(self, tok: torch.Tensor, state):
        if tok is not self.tok:
            self.tok.copy_(tok)
        if state is not self.state:
            for dst, src in zip(self.leaves, state_leaves(state)):
                dst.copy_(src)
        self.graph.replay()
        return self.logits, self.state


def _rebuild(state, leaves):
    """``state``'s nesting with its tensors replaced, in :func:`state_leaves` order."""
    if isinstance(state, torch.Tensor):
        return next(leaves)
    if isinstance(state, dict):
        built = {k: _rebuild(state[k], leaves) for k in sorted(state)}
        return {k: built[k] for k in state}
    out = [_rebuild(s, leaves) for s in state]
    if hasattr(state, "_fields"):   # a NamedTuple
        return type(state)(*out)
    return tuple(out) if isinstance(state, tuple) else out


def _copy(state):
    """A copy of a state of tensors (:func:`state_leaves`), its nesting kept."""
    return _rebuild(state, iter([t.clone() for t in state_leaves(state)]))


def graphed_step(step: Callable, tok: torch.Tensor, state) -> tuple[Callable, str]:
    """(the step to decode with, why not graphed or ""). On CUDA, for a state of tensors
    whose shapes one eager step keeps (:func:`state_leaves`, :func:`same_layout`), a
    :class:`GraphedStep`; elsewhere, or for a growing state (a KV cache), or when capture
    fails, ``step`` itself and the reason. The CPU path is never changed."""
    if tok.device.type != "cuda":
        return step, f"tensors on {tok.device.type}: CUDA graphs need CUDA"
    leaves = state_leaves(state)
    if leaves is None:
        return step, "the state is not a fixed set of tensors (a key/value cache grows)"
    _, new = step(tok, _copy(state))
    if not same_layout(leaves, state_leaves(new)):
        return step, "a step changes the state's shapes"
    try:
        return GraphedStep(step, tok, state), ""
    except Exception as e:   # a step that syncs or branches on a value cannot be captured
        torch.cuda.synchronize()
        return step, f"capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


@torch.no_grad()
def decode(lm: "LoadedLM", prompt_ids: list[int], max_new: int, temperature: float = 0.0,
           top_k: int | None = None, generator: torch.Generator | None = None,
           on_token: Callable[[int], object] | None = None,
           stop_ids: Iterable[int] | None = None) -> list[int]:
    """Up to ``max_new`` tokens after ``prompt_ids`` (a non-empty list of ids), one sequence.

    The prompt is read once: ``lm.start(ids (1, P))`` -> (logits (1, vocab), state), then
    each token costs ``lm.step(tok (1,), state)`` -> (logits (1, vocab), state); a model
    without start/step runs ``lm.logits(ids (1, <= max_length))`` -> (1, L, vocab) over the
    last ``max_length`` tokens for every token instead. Tokens are chosen by
    :func:`next_token`. ``on_token(id)`` is called with each token as it is chosen (a true
    return stops decoding after it: a closed window, a cancelled worker). Returns the new
    ids in order, ending with the stop token where one ended it (``stop_ids``, default
    :func:`stop_ids_of`; ``()``: none)."""
    if not prompt_ids:
        raise PromptError("decoding needs at least one prompt token (the prefix token for an empty prompt)")
    stops = set(stop_ids_of(lm) if stop_ids is None else (int(i) for i in stop_ids))
    out: list[int] = []
    if max_new <= 0:
        return out
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=lm.device)   # (1, P)
    stream = carries_state(lm)
    if stream:
        logits, state = lm.start(ids)                                           # (1, vocab)
    else:
        logits = lm.logits(ids[:, -lm.max_length:])[:, -1]                      # (1, vocab)
    for n in range(max_new):
        tok = next_token(logits, temperature, top_k, generator)                  # (1,)
        out.append(int(tok))
        if on_token is not None and on_token(out[-1]):
            break
        if out[-1] in stops or n + 1 == max_new:
            break  # no forward for a token that will not be generated
        if stream:
            logits, state = lm.step(tok, state)
        else:
            ids = torch.cat([ids, tok[:, None]], dim=1)
            logits = lm.logits(ids[:, -lm.max_length:])[:, -1]
    return out


class TextStream:
    """Token ids -> the text each adds, for printing as they are generated.

    Each :meth:`push` decodes a short context (the last prompt tokens, so a SentencePiece
    word keeps its leading space) plus the ids since, and returns what is new; text ending
    in U+FFFD (a character whose bytes are not all generated yet) is held back until the
    next push or :meth:`flush`. The context is cut back now and then, so the cost per token
    stays bounded."""

    CONTEXT = 4
    RESET = 64

    def __init__(self, decode: Callable[[list[int]], str], context: Iterable[int] = ()) -> None:
        self._decode = decode
        self.ids = [int(i) for i in context][-self.CONTEXT:]
        self.done = len(self._decode(self.ids)) if self.ids else 0

    def push(self, tok: int) -> str:
        self.ids.append(int(tok))
        full = self._decode(self.ids)
        new = full[self.done:]
        if new.endswith("\ufffd"):
            return ""
        self.done = len(full)
        if len(self.ids) > self.RESET:
            self.ids = self.ids[-self.CONTEXT:]
            self.done = len(self._decode(self.ids))
        return new

    def flush(self) -> str:
        """What is held back (an unfinished character, shown as U+FFFD)."""
        full = self._decode(self.ids) if self.ids else ""
        new, self.done = full[self.done:], len(full)
        return new
