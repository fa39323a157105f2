"""The sweep form's model picker: a filter input above the registry's models, grouped by
family, with a line saying what is picked.

The list is a :class:`~textual.widgets.SelectionList` that is rebuilt whenever the filter
changes; family headers are disabled entries (the cursor skips them, space and enter cannot
toggle them) drawn without a check box. Picks live beside the list, so a model picked and
then filtered out stays picked.

Keys: the list has the focus (F2 puts it there) and typing in it filters while the focus
stays in the list, so space picks the highlighted model right after a filter was typed and
``?`` is the help key; the first letter after a pick (or after the list got the focus)
starts a new filter, the next ones extend it, backspace erases; escape clears the filter.
Space or enter toggles a model. Several words (each must match the name, family or
description) are typed in the filter box itself: up from the list's first model goes
there, down or enter back into the list. After each change of the filter the cursor is
on the best match (:func:`rank`): a model named exactly as typed, then names starting with
it, then names containing it, then the rest in list order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Input, OptionList, SelectionList, Static
from textual.widgets.selection_list import Selection

import models

from workbench.tui.form_fields import FormInput  # (its erasing keys apply in the order typed)

# Families shown first to last: the few baselines before the long SSM grid, so that every
# family's header is on the first screen of the list; families not named here follow.
FAMILY_ORDER = ("attention", "rnn", "conv", "mlp", "hybrid", "ssm", "pretrained")


@dataclass(frozen=True)
class Entry:
    name: str
    family: str
    description: str


def registry_entries() -> list[Entry]:
    """The model registry, in its own (name) order."""
    return [Entry(n, models.entry(n).family or "other", models.describe(n)) for n in models.names()]


def matches(query: str, entry: Entry) -> bool:
    """Every word of ``query`` is a case-insensitive substring of the entry's name, family or
    description (each word may match a different one)."""
    hay = f"{entry.name}\n{entry.family}\n{entry.description}".lower()
    return all(word in hay for word in query.lower().split())


def rank(query: str, entry: Entry) -> int:
    """How well ``entry`` matches ``query`` (lower is better): 0 the name is the query, 1 the
    name starts with it, 2 the name contains it, 3 every word is in the name, 4 a match
    through the family or description only."""
    q, name = query.strip().lower(), entry.name.lower()
    if not q:
        return 4
    if name == q:
        return 0
    if name.startswith(q):
        return 1
    if q in name:
        return 2
    return 3 if all(w in name for w in q.split()) else 4


class _PickList(SelectionList):
    """A SelectionList whose disabled entries are family headers: no check box, and up from
    the first model leaves the list for the filter above it (instead of wrapping round)."""

    class UpFromTop(Message):
        """Up was pressed on the first model."""

    class Typed(Message):
        """A printable key (not space, which picks, nor ?, the help key) was typed in the
        list: it is filter text. ``character`` None: backspace (erase the last one)."""

        def __init__(self, character: str | None) -> None:
            super().__init__()
            self.character = character

    def on_key(self, event) -> None:
        if event.key == "space":
            # picked here, in the order of the keys (the space binding would run only once
            # the key bubbled up to the app: after the letters typed behind it)
            event.stop()
            event.prevent_default()
            if self.highlighted is not None and not self.get_option_at_index(self.highlighted).disabled:
                self._toggle_highlighted_selection()  # at once (OptionList's select posts a message)
            picker = next((a for a in self.ancestors if isinstance(a, ModelPicker)), None)
            if picker is not None:
                picker._fresh = True
            return
        # handled here, before any binding: the letters are the filter's even where an
        # ancestor binds them (the app's q), and the focus stays in the list
        if event.key == "backspace" or (event.character and event.is_printable and event.character not in " ?"):
            event.stop()
            event.prevent_default()
            character = None if event.key == "backspace" else event.character
            picker = next((a for a in self.ancestors if isinstance(a, ModelPicker)), None)
            if picker is not None:  # the filter and the list follow at once, before the next key
                picker.typed(character)  # (a space after it picks from the new list)
            else:
                self.post_message(self.Typed(character))

    def _on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if not 0 <= event.option_index < self.option_count:  # from before a rebuild: gone
            event.stop()
            event.prevent_default()

    def action_select(self) -> None:
        super().action_select()
        picker = next((a for a in self.ancestors if isinstance(a, ModelPicker)), None)
        if picker is not None:  # a letter after a pick starts a new filter, even before the
            picker._fresh = True  # SelectedChanged message is handled (issue 42 item 3)

    def render_line(self, y: int) -> Strip:
        # SelectionList maps screen line to option index one to one (so prompts never wrap:
        # see the no-wrap rule in app.tcss); a header gets OptionList's plain line, padded
        # by the check box's width so the line still spans the list
        index = self.scroll_offset.y + y
        if index < self.option_count and self.get_option_at_index(index).disabled:
            line = OptionList.render_line(self, y)
            return line.extend_cell_length(line.cell_length + self._get_left_gutter_width(),
                                           next(iter(line)).style if line.cell_length else None)
        return super().render_line(y)

    def action_cursor_up(self) -> None:
        first = next((i for i, o in enumerate(self.options) if not o.disabled), None)
        if self.highlighted is None or self.highlighted == first:
            self.post_message(self.UpFromTop())
        else:
            super().action_cursor_up()


class ModelPicker(Vertical):
    """Pick models for a sweep. ``picked`` is what is picked (registry order), filtered out
    or not; ``set_picked`` replaces it. Posts :class:`Changed` when the picks change."""

    BINDINGS = [
        Binding("escape", "clear_filter", "Clear filter"),
        Binding("down", "into_list", "To the list", show=False),
    ]

    class Changed(Message):
        def __init__(self, picker: ModelPicker) -> None:
            super().__init__()
            self.picker = picker

        @property
        def control(self) -> ModelPicker:  # lets handlers select by the picker's id
            return self.picker

    def __init__(self, entries: Iterable[Entry] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._entries = list(entries) if entries is not None else registry_entries()
        known = {e.family for e in self._entries}
        families = [f for f in FAMILY_ORDER if f in known] + sorted(known - set(FAMILY_ORDER))
        self._groups = [(f, [e for e in self._entries if e.family == f]) for f in families]
        self._width = max((len(e.name) for e in self._entries), default=0)
        # models picked, as of the last rebuild; for the models the list shows, the list's
        # own check boxes are what counts (see `picked`)
        self._picked: set[str] = set()
        self._shown: set[str] = set()
        # the next letter typed in the list starts a new filter (after a pick, or when the
        # list got the focus) instead of extending the one shown
        self._fresh = True
        self._had_focus = None  # which of the picker's widgets had the focus last

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        # no select-all on focus: up from the list continues the filter typed there
        yield FormInput(placeholder="type to filter: name, family or description (esc clears)",
                    id="models-filter", compact=True, select_on_focus=False)
        yield _PickList(*self._options(""), id="models-list", compact=True)
        yield Static("", id="models-picked")

    def on_mount(self) -> None:
        self._show_summary()

    def _options(self, query: str) -> list[Selection]:
        """Headers and entries matching ``query``; sets ``_shown``."""
        options: list[Selection] = []
        shown = set()
        for family, entries in self._groups:
            hits = [e for e in entries if matches(query, e)]
            if not hits:
                continue
            count = f"{len(hits)}" if len(hits) == len(entries) else f"{len(hits)} of {len(entries)}"
            # disabled: OptionList's cursor skips it and neither space nor enter selects it;
            # its value is no model name, so it can never be part of `picked`
            options.append(Selection(Text(f"{family} ({count})"), ("family", family), disabled=True))
            for e in hits:
                prompt = Text.assemble((e.name.ljust(self._width), "bold"), "  ", (e.description, "dim"))
                options.append(Selection(prompt, e.name, e.name in self._picked))
                shown.add(e.name)
        self._shown = shown
        return options

    @property
    def _list(self) -> _PickList:
        return self.query_one("#models-list", _PickList)

    @property
    def filter_input(self) -> Input:
        return self.query_one("#models-filter", Input)

    # ------------------------------------------------------------------ public API
    @property
    def picked(self) -> list[str]:
        """Picked model names in registry order, including those the filter hides."""
        on = set(self._list.selected)
        return [e.name for e in self._entries
                if e.name in on or (e.name in self._picked and e.name not in self._shown)]

    def set_picked(self, names: Iterable[str]) -> None:
        """Pick exactly ``names`` (names the registry does not have are ignored)."""
        self._picked = set(names)
        self._rebuild()
        self._picks_changed()

    @property
    def shown(self) -> list[str]:
        """The model names the filter lets through, in list order."""
        return [o.value for o in self._list.options if not o.disabled]

    def focus(self, scroll_visible: bool = True) -> ModelPicker:
        """Focus the list: typing there filters, space picks, ? is help (even when the
        filter hides every model: the letters still reach the filter). The next letter
        starts a new filter (F2 again: the old one found what it was for)."""
        self._fresh = True
        self._list.focus(scroll_visible)
        return self

    # ------------------------------------------------------------------ behaviour
    def _rebuild(self) -> None:
        lst = self._list
        # rebuilding re-selects the picked entries: that is no change to report
        query = self.filter_input.value
        self._built_query = query
        with lst.prevent(SelectionList.SelectedChanged):
            lst.clear_options()
            lst.add_options(self._options(query))
        lst.action_first()  # the first model, not its header
        best = self.best_match(query)
        if best is not None:
            lst.highlighted = next(i for i, o in enumerate(lst.options) if o.value == best)
        self._show_summary()

    def best_match(self, query: str) -> str | None:
        """The shown model that matches ``query`` best (:func:`rank`; ties: list order)."""
        by_name = {e.name: e for e in self._entries}
        shown = self.shown
        if not query.strip() or not shown:
            return None
        return min(shown, key=lambda n: (rank(query, by_name[n]), shown.index(n)))

    @on(Input.Changed, "#models-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()  # the form's own Input.Changed handlers are for its fields
        if self.filter_input.value == getattr(self, "_built_query", None):
            return  # the list shows this filter already (typed in the list: built at once)
        self._picked = set(self.picked)  # keep the picks of entries about to be hidden
        self._rebuild()

    @on(Input.Submitted, "#models-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_into_list()

    @on(SelectionList.SelectedChanged, "#models-list")
    def _list_changed(self, event: SelectionList.SelectedChanged) -> None:
        event.stop()
        self._fresh = True  # that filter found what it was for: the next letter starts anew
        self._picks_changed()

    @on(_PickList.UpFromTop)
    def _up_from_list(self, event: _PickList.UpFromTop) -> None:
        event.stop()
        self.filter_input.focus()

    @on(_PickList.Typed)
    def _typed_in_list(self, event: _PickList.Typed) -> None:
        event.stop()
        self.typed(event.character)

    def typed(self, character: str | None) -> None:
        """Filter text typed in the list (``character`` None: backspace): the focus stays
        there (space then picks the best match); a letter after a pick starts a new filter,
        the next ones extend it. Called by the list as each key arrives, and the list is
        rebuilt at once: under load, keys handled later than the list's own space key made
        a filter of two names run together and a space toggle a stale entry (issue 42)."""
        box = self.filter_input
        if character is None:
            box.value = box.value[:-1]
        elif self._fresh:
            box.value = character
        else:
            box.value += character
        self._fresh = False
        box.cursor_position = len(box.value)
        self._picked = set(self.picked)  # keep the picks of entries about to be hidden
        self._rebuild()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if event.widget is self._list and event.widget is not self._had_focus:
            self._fresh = True  # back in the list from elsewhere: a new filter
        self._had_focus = event.widget

    def action_into_list(self) -> None:
        if self._shown:
            self._list.focus()

    def action_clear_filter(self) -> None:
        self.filter_input.value = ""  # Input.Changed rebuilds the list

    def _picks_changed(self) -> None:
        self._show_summary()
        self.post_message(self.Changed(self))

    def _show_summary(self) -> None:
        picked = self.picked
        text = Text(f"{len(picked)} picked: {', '.join(picked)}" if picked else "none picked")
        hidden = sum(n not in self._shown for n in picked)
        if hidden:
            text.append(f"  ({hidden} hidden by the filter)", style="italic")
        query = self.filter_input.value.strip()
        if query:
            text.append(f"\nfilter {query!r}: {len(self._shown)} of {len(self._entries)} models shown"
                        if self._shown else f"\nno model matches {query!r} (escape clears the filter)",
                        style="dim")
        self.query_one("#models-picked", Static).update(text)
