"""The forms' text inputs, and the one way the form writes into them on its own.

A form fills some fields itself: "evaluate every" follows the budget and the steps a token
budget becomes (counted in a thread), a task switch puts the task's budget, learning rate
and lengths into the fields still holding the form's values, a size preset or recipe
empties the fields it fills. Each of those writes is decided from a change (a message) or
a background result that was started earlier; under load the user has typed since, and a
late write would overwrite what they typed (issue 42 item 3: ``50000`` typed into the
budget after clearing it became ``10000``, the auto value written into the cleared field
with the keys typed after it appended).

So every :class:`FormInput` remembers when its value last changed by any other means than
:func:`put` (a key, a paste, a profile loaded into the form), on the clock Textual stamps
its messages with, and :func:`put` writes only into a field that has not changed since
``since``: the time of the change the write answers (``event.time``) or at which a
background job read the form. A write whose moment has passed is dropped; the field
keeps what was typed.
"""
from __future__ import annotations

from textual import _time
from textual.widgets import Input


def now() -> float:
    """The clock of Textual's message times (``Message.time``): ``since`` for a job
    started now."""
    return _time.get_time()


class FormInput(Input):
    """An Input that records when its value was last changed other than by :func:`put`."""

    changed_at: float = 0.0  # never changed since it was built (its starting value)
    _form_writing: bool = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.changed_at = 0.0  # the value it was built with is nobody's edit

    def _watch_value(self, value: str) -> None:
        # runs as the value is set (synchronously): a key's edit is stamped before any
        # message about it, or about anything after it, is handled
        if not self._form_writing:
            self.changed_at = now()
        super()._watch_value(value)


def put(field: Input, value: str, since: float) -> bool:
    """Write ``value`` into ``field`` unless it changed after ``since`` (then keep what it
    holds: typed after the write was decided). True when written (or already holding it)."""
    if field.value == value:
        return True
    if getattr(field, "changed_at", 0.0) > since:
        return False
    field._form_writing = True
    try:
        field.value = value
    finally:
        field._form_writing = False
    return True
