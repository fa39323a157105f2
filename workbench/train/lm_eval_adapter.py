"""The workbench's causal LMs as an lm-evaluation-harness model (issue 34 item 1).

``WorkbenchLM`` is an ``lm_eval.api.model.TemplateLM`` (a subclass of ``LM``): the
harness's own base class turns (context, continuation) text into tokens the way its ``hf``
model does (trailing spaces of the context move to the continuation; the pair is encoded
whole and split at the context's length; an empty context is the prefix token), so the
adapter only scores tokens. Its three requests:

- ``loglikelihood``: the continuation's summed log-probability and whether greedy
  decoding would produce it, from one forward of context + continuation (right-padded
  batches, longest first; the left is truncated to ``max_length`` as ``hf`` does).
- ``loglikelihood_rolling``: a document's log-likelihood over the harness's disjoint
  rolling windows (``lm_eval.utils.get_rolling_token_windows``, one token of context).
- ``generate_until``: greedy decoding, one request at a time, token for token what the
  harness's ``hf`` model gets from ``model.generate(do_sample=False)`` (issue 41 item 3):
  it stops after an end-of-text token (``LoadedLM.eos_ids``, the generation config's
  ``eos_token_id`` as ``generate`` reads it), after a stop string (lm-eval's ``until`` plus
  the EOS text), checked as lm-eval's ``MultiTokenEOSCriteria`` checks it (the string in
  the last len(its tokens) + 2 generated tokens decoded *with* special tokens, so ``</s>``
  matches), or after ``max_gen_toks`` tokens; the text is then decoded without special
  tokens and cut before the first stop string. A budget the context window cannot hold
  (``max_gen_toks >= max_length``) is refused, as the ``hf`` model refuses it. A model that
  can carry state (``LoadedLM.start`` / ``step``: the recurrent state of Mamba-like
  backbones, the cache of ``transformers`` models) reads the context once and then costs
  one token per step; any other is run again over the whole sequence for every new token.

A log-likelihood continuation longer than the context window cannot be scored (its first
tokens would have to be predicted from outside the window): refused in one line, where the
``hf`` model stops on a bare assertion.

The model side is a :class:`LoadedLM` (workbench/train/eval_models.py builds them from a
Hugging Face folder or hub id, or from a workbench run's checkpoint).

On several ranks (``eval.devices = N``; workbench/train/eval_run.py joins the group) each
rank's adapter holds the whole model and lm-eval's evaluator gives it every N-th document
(``rank``, ``world_size``); the evaluator then calls ``all_gather`` (request counts, to pad
the ranks to equal work), ``barrier`` and ``gather_object`` (each rank's per-document
metrics to rank 0), here over torch.distributed (distributed.Group: gloo on the CPU, the
Python objects over gloo also on a GPU run). lm-eval concatenates the gathered lists rank
by rank; :func:`in_document_order` hands them to it in the documents' order instead, so
rank 0 aggregates the very list one process would: float sums in the same order, and
bootstrapped standard errors (a seeded resampling of that list) equal to one rank's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

try:  # the optional extra `eval`; importing this module without it is an error naming it
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
except ImportError as e:  # pragma: no cover - exercised where lm-eval is absent
    raise ImportError("evaluation needs lm-evaluation-harness: pip install 'ssm-workbench[eval]' "
                      f"(or pip install 'lm-eval>=0.4'); {e}") from None


@dataclass
class LoadedLM:
    """A causal LM and its tokenizer, as the adapter needs them.

    ``logits(ids)``: ids long (batch, length) -> logits float (batch, length, vocab).
    ``start(ids)`` -> (logits of the last position (batch, vocab), state) and
    ``step(tok, state)``: tok long (batch,) -> (logits (batch, vocab), next state): the
    streaming pair, None where the model has no state to carry.
    ``encode(text, add_special_tokens)`` -> ids, ``decode(ids, skip_special)`` -> text.
    ``eos_ids``: the token ids after which generation ends (``model.generate``'s
    ``eos_token_id``); None: ``eot_id`` alone. ``greedy_changes``: the checkpoint's
    generation settings that would make ``model.generate``'s greedy tokens differ from the
    argmax (``eval_models.greedy_changes``: a repetition penalty, beams...); generation is
    refused while any is set.
    """
    name: str
    logits: Callable[[torch.Tensor], torch.Tensor]
    encode: Callable[[str, bool | None], list[int]]
    decode: Callable[[list[int], bool], str]
    eot_id: int
    prefix_id: int
    max_length: int
    device: torch.device
    start: Callable[[torch.Tensor], tuple[torch.Tensor, Any]] | None = None
    step: Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]] | None = None
    info: dict = field(default_factory=dict)  # what was loaded (kind, backend, parameters)
    eos_ids: tuple[int, ...] | None = None
    greedy_changes: tuple[str, ...] = ()


class WorkbenchLM(TemplateLM):
    """lm-eval's ``LM`` over a :class:`LoadedLM` (module doc). ``batch_size``: sequences per
    forward in the log-likelihood requests; ``max_gen_toks``: the default generation
    budget (the harness's ``hf`` model uses 256)."""

    def __init__(self, lm: LoadedLM, batch_size: int = 8, max_gen_toks: int = 256, group=None):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        self.lm, self.batch_size, self.max_gen_toks = lm, int(batch_size), int(max_gen_toks)
        self.group = group  # a workbench.train.distributed.Group on several ranks, else None
        self.generation = {"streamed": 0, "recomputed": 0}  # how generate_until ran (tests read it)
        self.generated: list[list[int]] = []  # the tokens of the last generate_until's answers, in order
        # called as progress(done, total) after each batch of log-likelihoods and each
        # generation: an evaluation run shows how far into a task it is (a task of 10,000
        # documents takes hours on a small GPU; progress per finished task alone sat at 0%)
        self.progress = None

    # -- what TemplateLM asks for -------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.lm.eot_id

    @property
    def prefix_token_id(self) -> int:
        return self.lm.prefix_id

    @property
    def max_length(self) -> int:
        return self.lm.max_length

    @property
    def device(self) -> torch.device:
        return self.lm.device  # where lm-eval puts the tensors it all-gathers

    # -- several ranks (module doc) -----------------------------------------------------
    @property
    def rank(self) -> int:
        return self.group.rank if self.group is not None else 0

    @property
    def world_size(self) -> int:
        return self.group.world if self.group is not None else 1

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated in rank order along dim 0 (a 0-d tensor, as
        lm-eval sends its request count, counts as shape (1,)): (world * n, ...)."""
        if self.group is None:
            return tensor
        return torch.cat(self.group.gather(torch.atleast_1d(tensor)))

    def gather_object(self, obj, dst: int = 0):
        """Rank ``dst``: every rank's ``obj`` (picklable) as a list in rank order, with the
        per-document lists put in document order (:func:`in_document_order`); others: None."""
        if self.group is None:
            return [obj]
        out = [None] * self.world_size if self.rank == dst else None
        self.group.dist.gather_object(obj, out, dst=dst, group=self.group.control)
        return in_document_order(out) if out is not None else None

    def barrier(self) -> None:
        if self.group is not None:
            self.group.dist.barrier(group=self.group.control)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return list(self.lm.encode(string, add_special_tokens))

    def tok_decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.lm.decode(list(ids), skip_special_tokens)

    # -- log-likelihoods ----------------------------------------------------------------
    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: [(key, context_enc, continuation_enc)] -> [(log p(continuation), greedy)]."""
        for _, _, cont in requests:  # before any forward: one line, not a shape error halfway
            if len(cont) > self.max_length:
                raise ValueError(
                    f"a continuation of {len(cont)} tokens is longer than the model's context window of "
                    f"{self.max_length} tokens: its first {len(cont) - self.max_length} cannot be predicted "
                    "from inside one window, so it cannot be scored (lm-eval's hf model refuses it too)")
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        # longest first, so a batch pads little (the order of the answers is restored)
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        for b in range(0, len(order), self.batch_size):
            idx = order[b:b + self.batch_size]
            inputs, conts = [], []
            for i in idx:
                _, ctx, cont = requests[i]
                if not cont:
                    raise ValueError("lm-eval asked for the log-likelihood of an empty continuation")
                # the last max_length tokens of context + continuation, minus the final one
                # (nothing predicts from it): what the harness's hf model feeds
                inputs.append((list(ctx) + list(cont))[-(self.max_length + 1):][:-1])
                conts.append(list(cont))
            width = max(len(x) for x in inputs)
            ids = torch.zeros(len(inputs), width, dtype=torch.long)
            for r, x in enumerate(inputs):
                ids[r, :len(x)] = torch.tensor(x)  # right padding: causal, so the real positions are unaffected
            logp = F.log_softmax(self.lm.logits(ids.to(self.lm.device)).float(), dim=-1)  # (b, width, vocab)
            for r, i in enumerate(idx):
                n, cont = len(inputs[r]), conts[r]
                lp = logp[r, n - len(cont):n]                             # (len(cont), vocab)
                target = torch.tensor(cont, device=lp.device)
                greedy = bool((lp.argmax(-1) == target).all())
                out[i] = (float(lp.gather(-1, target[:, None]).sum()), greedy)
                self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
            if self.progress is not None:
                self.progress(b + len(idx), len(order))
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood over disjoint windows of at most max_length tokens,
        the first conditioned on the prefix token (the harness's rolling scheme)."""
        windows, owner = [], []
        for n, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(n)
        scores = self._loglikelihood_tokens(windows) if windows else []
        totals = [0.0] * len(requests)
        for n, (lp, _) in zip(owner, scores):
            totals[n] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation ---------------------------------------------------------------------
    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations (module doc): what lm-eval's hf model answers, request by request."""
        if self.lm.greedy_changes and requests:
            raise ValueError(
                f"{self.lm.name}'s generation config sets {', '.join(self.lm.greedy_changes)}, which "
                "model.generate (and so lm-eval's hf model) applies to greedy decoding and the "
                "workbench's decoder does not: its answers would not be the model's. Remove the "
                "setting from generation_config.json, or evaluate the generation tasks with lm-eval's hf model")
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        out, self.generated = [], []
        for req in requests:
            context, gen_kwargs = req.args
            kw = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kw.get("do_sample"):
                raise ValueError("the workbench's lm-eval adapter decodes greedily only; the task asks "
                                 "for sampling (do_sample = true)")
            until = handle_stop_sequences(kw.get("until"), eos=eos)
            budget = int(kw["max_gen_toks"])
            if budget >= self.max_length:  # the hf model: max_length - max_gen_toks must be > 0
                raise ValueError(
                    f"max_gen_toks = {budget} leaves no room for a context in the model's window of "
                    f"{self.max_length} tokens (lm-eval's hf model refuses it too): lower the task's "
                    "max_gen_toks or raise max_length")
            ctx = self.tok_encode(context)[-(self.max_length - budget):]
            text, toks = self._greedy(ctx, budget, until)
            self.generated.append(toks)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
            if self.progress is not None:
                self.progress(len(out), len(requests))
        return out

    def _greedy(self, ctx: list[int], budget: int, until: list[str]) -> tuple[str, list[int]]:
        """Greedy tokens after ``ctx`` until an end-of-text token, a stop string or ``budget``
        tokens, each stop checked as ``model.generate`` with lm-eval's stopping criteria
        checks it (module doc); -> (the text before the first stop string, the tokens)."""
        dev, new = self.lm.device, []
        eos_ids = set(self.lm.eos_ids if self.lm.eos_ids is not None else (self.lm.eot_id,))
        # lm-eval's MultiTokenEOSCriteria: the stop string within the last len(its tokens) + 2
        # generated tokens, decoded with special tokens (a multi-token string may come out
        # in other pieces than its own encoding)
        stops = [(s, len(self.tok_encode(s, add_special_tokens=False)) + 2) for s in until if s]
        ids = torch.tensor([ctx], dtype=torch.long, device=dev)
        stream = self.lm.start is not None and self.lm.step is not None
        self.generation["streamed" if stream else "recomputed"] += 1
        if stream:
            logits, state = self.lm.start(ids)                          # (1, vocab)
        else:
            logits = self.lm.logits(ids)[:, -1]
        for n in range(budget):
            tok = logits.argmax(-1)                                       # (1,)
            new.append(int(tok))
            if new[-1] in eos_ids or any(s in self.tok_decode(new[-k:], skip_special_tokens=False)
                                         for s, k in stops):
                break
            if n + 1 == budget:
                break  # no forward for a token that will not be generated
            if stream:
                logits, state = self.lm.step(tok, state)
            else:
                ids = torch.cat([ids, tok[:, None]], dim=1)[:, -self.max_length:]
                logits = self.lm.logits(ids)[:, -1]
        text = self.tok_decode(new)  # without special tokens, as the hf model decodes its answer
        for s in until:  # cut at the first stop string, as the harness's models do
            if s:
                text = text.split(s)[0]
        return text, new


def in_document_order(parts: list) -> list:
    """The ranks' gathered objects ``parts`` (rank order) with their per-document lists in
    the documents' order. lm-eval's evaluator gathers ``{task: {(metric, filter): [value per
    document]}}`` from each rank, rank r holding documents r, r + N, r + 2N, ...
    (``lm_eval.utils.create_iterator``), and chains the lists rank by rank; here the lists
    at each key path are interleaved back (document d = rank d % N's (d // N)-th) into rank
    0's entry, the others' emptied, so that chain is the one-process list. Anything not a
    dict of lists is left as gathered."""
    if not parts or not all(isinstance(p, dict) for p in parts):
        return parts

    def merge(items: list):
        if all(isinstance(x, dict) for x in items):
            keys = list(dict.fromkeys(k for x in items for k in x))
            if not all(all(k in x for x in items) for k in keys):
                return None  # the ranks disagree on the keys: leave it to lm-eval
            got = {k: merge([x[k] for x in items]) for k in keys}
            return None if any(v is None for v in got.values()) else got
        if all(isinstance(x, list) for x in items):
            n, world = sum(len(x) for x in items), len(items)
            if any(len(x) != (n - r + world - 1) // world for r, x in enumerate(items)):
                return None  # not the round-robin split's sizes
            return [items[d % world][d // world] for d in range(n)]
        return None

    merged = merge(parts)
    if merged is None:
        return parts
    return [merged] + [_emptied(p) for p in parts[1:]]


def _emptied(obj):
    """``obj`` with every list at its leaves empty (same keys, so lm-eval's chain finds them)."""
    return {k: _emptied(v) for k, v in obj.items()} if isinstance(obj, dict) else []
