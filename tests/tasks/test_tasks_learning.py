"""A tiny model learns the synthetic tasks well above chance in a few hundred CPU steps.

These check that the targets are learnable from the inputs as the tasks document them
(a generator whose answer is not in the inputs, or whose targets are misaligned, stays at
chance). The model is composed by the lead's ``workbench.train.compose.build_model``.
"""
from __future__ import annotations

import pytest
import torch

import tasks
from tasks import metrics

compose = pytest.importorskip("workbench.train.compose")


@pytest.fixture(autouse=True)
def one_thread():
    # two cores shared with other test processes: one thread is several times faster here
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def train_and_eval(task, model_name, steps, lr=3e-3, batch_size=32):
    torch.manual_seed(0)
    m = compose.build_model(task, model_name, d_model=32, n_layers=2)
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    train = task.train_set(0) if task.fixed_train else None
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        if train is not None:
            idx = torch.randint(0, len(train), (batch_size,), generator=g)
            x, y = train.inputs[idx], train.targets[idx]
        else:
            x, y = task.train_batch(batch_size, step, 0)
        loss = metrics.loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ev = task.eval_sets(0)[""]
    with torch.no_grad():
        return metrics.counts(m(ev.inputs), ev.targets)


def test_mad_selective_copying_is_learned():
    t = tasks.build("mad_selective_copying", seq_len=24, vocab_size=8, num_tokens_to_copy=3,
                    num_train_examples=4096, num_test_examples=256)
    c = train_and_eval(t, "transformer", 300)
    assert c.token_accuracy > 0.6, c          # chance: 1/6


def test_mqar_is_learned():
    t = tasks.build("mqar", seq_len=24, vocab_size=24, num_kv_pairs=3, num_test_examples=256)
    c = train_and_eval(t, "transformer", 250)
    assert c.token_accuracy > 0.6, c          # chance: 1/12 (one of the value tokens)


def test_induction_heads_is_learned():
    t = tasks.build("induction_heads", seq_len=32, vocab_size=8, eval_lens=[32],
                    num_test_examples=256)
    c = train_and_eval(t, "transformer", 300)
    assert c.token_accuracy > 0.6, c          # chance: 1/7
