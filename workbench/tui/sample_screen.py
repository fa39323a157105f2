"""The run view's sample window (key ``g``, issue 42 item 2): text from a finished ``lm``
run, streamed into the window as it is generated.

A prompt, the tokens to generate, the temperature (0: greedy) and the seed; enter in any
field generates. The model is checked as ``eval`` checks it (workbench/execute/eval_queue.py
``preflight``), loaded once per window with the tokenizer kept beside its weights
(workbench/train/eval_models.py) and decoded by workbench/train/decode.py (the recurrent
state carried, or the window recomputed for a model without one, which the status line
says) in a thread worker, so the UI stays live; each token's text is appended as it comes.
Top-k is 200 as in ``ssm-workbench sample``, whose command line the status line shows for
the same text. Escape closes the window and stops the decoding at its next token.
"""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

TOP_K = 200  # as `ssm-workbench sample`'s default


def refusal(run) -> str | None:
    """Why run ``run`` (a store Run, or None) offers no text, in one line; None when it does."""
    if run is None:
        return "the run is not in the store"
    if run.spec.get("kind") == "eval" or run.task != "lm":
        return f"run {run.id} is a {run.spec.get('kind', run.task)!r} run: only runs of the lm task generate text"
    if run.state != "finished":
        return f"run {run.id} is {run.state}: sample it once it has finished (its weights are kept then)"
    return None


def read_fields(prompt: str, tokens: str, temperature: str, seed: str) -> tuple[dict | None, str | None]:
    """The fields as decoding settings, or (None, a one-line error naming the field)."""
    try:
        n = int(tokens)
        assert n >= 1
    except (ValueError, AssertionError):
        return None, f"tokens: expected an integer >= 1, got {tokens!r}"
    try:
        t = float(temperature)
        assert t >= 0
    except (ValueError, AssertionError):
        return None, f"temperature: expected a number >= 0 (0 = greedy), got {temperature!r}"
    try:
        s = int(seed)
    except ValueError:
        return None, f"seed: expected an integer, got {seed!r}"
    return {"prompt": prompt, "tokens": n, "temperature": t, "seed": s}, None


class SampleScreen(ModalScreen[None]):
    """Sample text from a run (module doc)."""

    DEFAULT_CSS = """
    SampleScreen { align: center middle; }
    #sample-dialog { width: 90%; max-width: 110; height: 90%; max-height: 34; border: thick $accent;
                     background: $surface; padding: 0 1; }
    #sample-dialog .dialog-title { text-style: bold; margin-bottom: 0; }
    #sample-prompt { width: 1fr; }
    #sample-settings { height: 3; }
    #sample-settings Label { padding: 1 1 0 1; }
    #sample-tokens, #sample-seed { width: 10; }
    #sample-temperature { width: 10; }
    #sample-status { height: auto; color: $text-muted; }
    #sample-output { height: 1fr; border: round $primary; }
    #sample-text { height: auto; }
    """

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, store, run_id: int, lock=None, device: str = "auto") -> None:
        super().__init__()
        self.store, self.run_id, self.device = store, run_id, device
        self.lock = lock or nullcontext()
        self.lm = None            # the loaded model, kept for the next generation in this window
        self.busy = False
        self.cancel = threading.Event()
        self.text = ""            # what the output area shows
        self.tokens: list[int] = []  # the last generation's ids (tests read them)
        self.mode: str | None = None  # "state" or "recompute": how the last generation ran

    def compose(self) -> ComposeResult:
        with Vertical(id="sample-dialog"):
            yield Label(f"Sample text from run {self.run_id}", classes="dialog-title")
            yield Input(placeholder="prompt (empty: from the start of a document); enter generates",
                        id="sample-prompt")
            with Horizontal(id="sample-settings"):
                yield Label("tokens")
                yield Input("200", id="sample-tokens")
                yield Label("temperature")
                yield Input("0.8", id="sample-temperature")
                yield Label("seed")
                yield Input("0", id="sample-seed")
            yield Static("enter: generate   esc: close", id="sample-status", markup=False)
            with VerticalScroll(id="sample-output"):
                yield Static("", id="sample-text", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#sample-prompt", Input).focus()

    # ------------------------------------------------------------------ actions
    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.generate()

    def generate(self) -> None:
        """Start a generation with the fields' settings (nothing while one runs)."""
        if self.busy:
            self._status("still generating: wait for it, or esc to close")
            return
        value = {k: self.query_one(f"#sample-{k}", Input).value
                 for k in ("prompt", "tokens", "temperature", "seed")}
        settings, error = read_fields(**value)
        if error:
            self._status(error, error=True)
            return
        self.busy = True
        self.cancel.clear()
        self.text = settings["prompt"]
        self._show()
        self._status("loading the model..." if self.lm is None else "generating...")
        self.run_worker(lambda: self._work(settings), thread=True, group="sample", exit_on_error=False)

    def action_close(self) -> None:
        self.cancel.set()  # the worker stops after its current token
        self.dismiss(None)

    # ------------------------------------------------------------------ the worker (a thread)
    def _work(self, s: dict) -> None:
        try:
            self._generate(s)
        except Exception as e:  # a model that fails to load or decode: one line, not a crash
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            self._later(self._finish, f"{type(e).__name__}: {msg}" if not isinstance(e, ValueError) else msg, True)

    def _generate(self, s: dict) -> None:
        import torch

        from workbench.train.decode import (TextStream, carries_state, decode, keeps_cache, new_tokens, prompt_ids,
                                            stop_ids_of)
        if self.lm is None:
            self.lm = self._load()
        lm = self.lm
        ids = prompt_ids(lm, s["prompt"])
        count, note = new_tokens(lm, len(ids), s["tokens"])
        stops = stop_ids_of(lm)
        stream = TextStream(lambda xs: lm.decode(xs, True), context=ids)
        self.mode = "state" if carries_state(lm) else "recompute"
        how = (("key/value cache carried" if keeps_cache(lm) else "recurrent state carried") if self.mode == "state" else
               "no state to carry: the window is recomputed for every token")
        how += f"; {note}" if note else ""
        self._later(self._status, f"generating ({how})...")

        def on_token(tok: int) -> bool:
            if tok not in stops:
                piece = stream.push(tok)
                if piece:
                    self._later(self._append, piece)
            return self.cancel.is_set()

        gen = torch.Generator().manual_seed(s["seed"])
        t0 = time.perf_counter()
        self.tokens = decode(lm, ids, count, temperature=s["temperature"], top_k=TOP_K, generator=gen,
                             on_token=on_token, stop_ids=stops)
        secs = time.perf_counter() - t0
        tail = stream.flush()
        if tail:
            self._later(self._append, tail)
        ended = "end-of-text" if self.tokens and self.tokens[-1] in stops else f"{count} tokens"
        cli = (f"ssm-workbench sample run:{self.run_id} --tokens {s['tokens']} --temperature {s['temperature']:g}"
               f" --seed {s['seed']}")
        self._later(self._finish, f"{len(self.tokens)} tokens in {secs:.1f} s, stopped at {ended} "
                                  f"({how}). Same text: {cli} --prompt ...", False)

    def _load(self):
        from workbench.execute import eval_queue
        from workbench.train import eval_models
        from workbench.train.measure import pick_device

        ref = f"run:{self.run_id}"
        with self.lock:  # eval's checks (the run, its state, its weights readable)
            eval_queue.preflight(self.store, [{"model": ref, "label": ref, "fields": {"model": ref}, "eval": {}}])
        return eval_models.load(ref, pick_device(self.device), store_root=self.store.root)

    def _later(self, fn, *args) -> None:
        """``fn(*args)`` on the UI thread; nothing once the window or the app has closed."""
        if self.cancel.is_set():
            return
        try:
            self.app.call_from_thread(fn, *args)
        except Exception:  # the app is gone (quit while generating)
            self.cancel.set()

    # ------------------------------------------------------------------ on the UI thread
    def _append(self, piece: str) -> None:
        self.text += piece
        self._show()

    def _show(self) -> None:
        if not self.is_attached:
            return
        self.query_one("#sample-text", Static).update(Text(self.text))
        self.query_one("#sample-output", VerticalScroll).scroll_end(animate=False)

    def _finish(self, line: str, error: bool) -> None:
        self.busy = False
        self._status(line, error=error)

    def _status(self, line: str, error: bool = False) -> None:
        if self.is_attached:
            self.query_one("#sample-status", Static).update(Text(line, style="bold red" if error else ""))
