"""Tasks: data generators and datasets, built by name.

>>> import tasks
>>> t = tasks.build("mad_selective_copying", seq_len=20, vocab_size=16, num_tokens_to_copy=5)
>>> inputs, targets = t.sample(8, seed=0)   # targets == -100 where no loss is taken
"""
from tasks.base import IGNORE, Batch, Task  # noqa: F401
from tasks.registry import (  # noqa: F401
    UnknownTaskError,
    build,
    check_params,
    describe,
    names,
    parameters,
    register,
    task_class,
)

# Task modules register themselves on import.
from tasks import (  # noqa: F401,E402
    char_lm,
    images,
    induction_heads,
    lm,
    mad,
    modular_arithmetic,
    mqar,
    permutation_composition,
    selective_copying,
    state_tracking,
    text_classification,
)
from tasks import heads  # noqa: F401,E402
