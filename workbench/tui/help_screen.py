"""The ``?`` help screen: every key of the screen it was opened over, read from the
``BINDINGS`` of the app, of that screen and of each workbench widget shown on it, so the
list cannot drift from what the keys do.

Keys are grouped by where they work (everywhere, the runs table, the sweep form, ...);
keys that act only where the focus is say so in the section title.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.dom import DOMNode
from textual.keys import key_to_character
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey

# section titles of the workbench's screens and widgets (a class not named here is titled
# by the first line of its docstring)
TITLES = {
    "WorkbenchApp": "Everywhere",
    "RunsTable": "Runs table (F1)",
    "SweepForm": "Sweep form (F2)",
    "ModelPicker": "Model list in the sweep form",
    "ResultsView": "Results (F3)",
    "EvalForm": "Evaluation form (F4)",
    "RunScreen": "Run view",
    "CompareScreen": "Compare view",
}
# keys a widget handles itself rather than through BINDINGS (listed in its section)
OWN_KEYS = {
    "ModelPicker": [("letters", "filter the list (the focus stays in the list); after a pick a new filter"),
                    ("space / enter", "pick or unpick the highlighted model"),
                    ("backspace", "erase the filter's last letter"),
                    ("↑ on the first model", "into the filter box (several words, each must match)")],
}
# Textual's own keys that every screen has (not in any workbench BINDINGS)
GENERAL = [("tab / shift+tab", "move the focus to the next / previous control"),
           ("ctrl+p", "command palette: the workbench's commands (new sweep, new evaluation, open "
                      "profile, compare marked, export, figures) and Textual's")]
KEY_NAMES = {"escape": "esc", "space": "space", "up": "↑", "down": "↓", "left": "←", "right": "→",
             "slash": "/", "backslash": "\\"}


@dataclass
class Section:
    title: str
    keys: list[tuple[str, str]]  # (key(s), what it does)


def key_name(key: str) -> str:
    """'ctrl+s' stays, 'escape' -> 'esc', 'question_mark' -> '?', 'slash' -> '/'."""
    if key in KEY_NAMES:
        return KEY_NAMES[key]
    char = key_to_character(key)
    return char if char and char.isprintable() and not char.isspace() else key


def own_bindings(cls: type) -> list[Binding]:
    """The bindings ``cls`` and its workbench base classes declare (Textual's own widget
    keys, such as a list's cursor keys, are left to GENERAL), in declaration order."""
    out: list[Binding] = []
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("workbench.") and "BINDINGS" in vars(klass):
            out += [b if isinstance(b, Binding) else Binding(*b) for b in vars(klass)["BINDINGS"]]
    return out


def section_of(cls: type) -> Section | None:
    """One section for a class's bindings: keys of one action are joined ('esc / backspace')."""
    rows: dict[tuple[str, str], list[str]] = {}
    for b in own_bindings(cls):
        # the tooltip is the longer wording of the footer's short description
        what = b.tooltip or b.description or b.action.replace("_", " ")
        keys = [key_name(k.strip()) for k in b.key.split(",") if k.strip()]
        if b.key_display:
            keys = [b.key_display]
        rows.setdefault((b.action, what), []).extend(keys)
    own = OWN_KEYS.get(cls.__name__, [])
    if not rows and not own:
        return None
    title = TITLES.get(cls.__name__) or (cls.__doc__ or cls.__name__).strip().splitlines()[0]
    return Section(title, own + [(" / ".join(dict.fromkeys(keys)), what) for (_, what), keys in rows.items()])


def shown(node: DOMNode) -> bool:
    """Whether ``node`` is part of what the screen shows (not in a hidden tab)."""
    return all(getattr(n, "display", True) for n in node.ancestors_with_self)


def sections_for(app: App, screen: Screen) -> list[Section]:
    """The help of ``screen``: the app's keys, the screen's own and those of each
    workbench widget shown on it (in the order they appear), then Textual's general keys."""
    classes: list[type] = [type(app), type(screen)]
    for w in screen.walk_children(with_self=False):
        if type(w).__module__.startswith("workbench.") and shown(w) and type(w) not in classes:
            classes.append(type(w))
    out = [s for s in (section_of(c) for c in classes) if s is not None]
    out.append(Section("Keys of every screen", list(GENERAL)))
    return out


def help_text(sections: list[Section]) -> Text:
    width = max((len(k) for s in sections for k, _ in s.keys), default=4) + 2
    out = Text()
    for i, s in enumerate(sections):
        out.append(("\n" if i else "") + s.title + "\n", style="bold")
        for keys, what in s.keys:
            out.append(f"  {keys:<{width}}", style="bold cyan")
            out.append(f"{what}\n")
    return out


class KeysFooter(Footer):
    """Textual's footer with ``?`` (this help) first: the app's keys come after the focused
    widget's. Keys are in priority order (``?``, then the focused widget's, then the
    screen's and app's); on a narrow terminal the keys past the first that does not fit
    whole are hidden, never cut mid-word (Textual's footer clips at its edge: "f Thi")."""

    def compose(self):
        widgets = list(super().compose())
        first = [w for w in widgets if isinstance(w, FooterKey) and w.action in ("help", "app.help")]
        yield from first + [w for w in widgets if w not in first]

    async def recompose(self) -> None:
        await super().recompose()
        self.call_after_refresh(self.fit_keys)

    def on_resize(self) -> None:
        self.fit_keys()

    def fit_keys(self) -> None:
        """Show the keys, in order, while each fits whole in the footer's width."""
        room = self.size.width
        keys = [w for w in self.children if not w.has_class("-command-palette")]
        for w in self.children:
            if w.has_class("-command-palette"):
                room -= w.render().cell_len + w.styles.margin.width + w.styles.padding.width
        fits = True
        for w in keys:
            # a key's width from its text (a hidden widget has no size to read)
            width = (w.render().cell_len if isinstance(w, FooterKey) else w.get_content_width(self.size, self.size)) \
                + w.styles.margin.width
            fits = fits and width <= room
            room -= width
            if w.display != fits:
                w.display = fits


class HelpScreen(ModalScreen[None]):
    """Keys of the screen below, generated from its bindings; esc, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close help")]

    def __init__(self, sections: list[Section], title: str = "Keys") -> None:
        super().__init__()
        self.sections, self.heading = sections, title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="help-dialog"):
            yield Static(Text(self.heading, style="bold"), classes="dialog-title")
            with VerticalScroll(id="help-body"):
                yield Static(help_text(self.sections), id="help-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()  # arrows and page keys scroll a long list

    def action_close(self) -> None:
        self.dismiss(None)
