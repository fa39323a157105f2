"""The forms' text inputs, and the one way the form writes into them on its own.

A form fills some fields itself: "evaluate every" follows the budget and the steps a token
budget becomes (counted in a thread), a task switch puts the task's budget, learning rate
and lengths into the fields still holding the form's values, a size preset or recipe
empties the fields it fills. Each of those writes is decided from a change (a message) or
a background result that was started earlier; under load the user has typed since, and a
late write would overwrite what they typed (issue 42 item 3: ``50000`` typed into the
budget after clearing it became ``10000``, the auto value written into the cleared field
with the keys typed after it appended).

Under load Textual also reorders a field's own editing keys against the letters typed
after them (:data:`EDIT_KEYS`): a FormInput applies them in the order typed.

So every :class:`FormInput` remembers when its value last changed by any other means than
:func:`put` (a key, a paste, a profile loaded into the form), on the clock Textual stamps
its messages with, and :func:`put` writes only into a field that has not changed since
``since``: the time of the change the write answers (``event.time``) or at which a
background job read the form. A write whose moment has passed is dropped; the field
keeps what was typed.
"""
from __future__ import annotations

from textual import _time, events
from textual.binding import Binding
from textual.widgets import Input

# Input's own editing keys (backspace, ctrl+u, delete, the cursor keys, ...) -> action.
# Textual runs a widget's (non-priority) bindings only once the key has bubbled up to the
# app, while a printable key is inserted by the Input itself as it arrives: under load
# 'ctrl+u b p e' then erased the 'bpe' typed after it (the keys in the Input's queue were
# inserted before the binding ran). A FormInput runs them itself, in the order typed.
EDIT_KEYS: dict[str, str] = {
    key.strip(): b.action
    for b in Input.BINDINGS if isinstance(b, Binding) and not b.priority
    for key in b.key.split(",")
}


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

    async def _on_key(self, event: events.Key) -> None:
        action = EDIT_KEYS.get(event.key)
        if action is not None:  # here, before the keys typed after it (see EDIT_KEYS)
            event.stop()
            event.prevent_default()  # (Input's own handler, and the binding, do not run)
            await self.run_action(action)

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
