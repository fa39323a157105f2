"""Modal dialogs: a yes/no confirmation, a path prompt (save / load profile) and the
question a launch asks when its profile name already holds another sweep."""
from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, OptionList, Static


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True only on 'y'."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, id="question")
            yield Label("[b]y[/b] yes    [b]n[/b] / [b]esc[/b] no", classes="hint")
        yield Footer()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class NameClashScreen(ModalScreen["str | None"]):
    """A launch into a profile name whose runs in the store are another sweep (issue 41:
    four tasks under one name came out averaged as seeds). Names what differs and offers a
    fresh name (enter or f, the default), the same profile anyway (s), or no launch (esc);
    dismisses with ``"fresh"``, ``"same"`` or None."""

    DEFAULT_CSS = """
    NameClashScreen { align: center middle; }
    NameClashScreen #clash-choices { margin-top: 1; }
    """
    SHOWN = 8  # differences listed; the others are counted

    BINDINGS = [
        Binding("enter,f", "answer('fresh')", "Fresh name"),
        Binding("s", "answer('same')", "Same profile"),
        Binding("escape,c", "answer(None)", "Cancel"),
    ]

    def __init__(self, name: str, fresh: str, diffs: list[str], held: int) -> None:
        """``name``: the profile name asked about; ``fresh``: the one proposed instead;
        ``diffs``: "key this-sweep's vs the store's" lines; ``held``: runs under ``name``."""
        super().__init__()
        self.profile_name, self.fresh, self.diffs, self.held = name, fresh, diffs, held

    def compose(self) -> ComposeResult:
        shown = self.diffs[:self.SHOWN]
        more = len(self.diffs) - len(shown)
        lines = [f"  • {d}" for d in shown] + ([f"  • and {more} more"] if more > 0 else [])
        text = (f"Profile '{self.profile_name}' already holds {self.held} run(s) of another sweep "
                f"(this sweep's value vs the store's):\n" + "\n".join(lines) +
                "\n\nUnder one name their results would be compared and averaged as one sweep.")
        with Vertical(classes="dialog", id="name-clash"):
            yield Label("Launch under which profile name?", classes="dialog-title")
            yield Static(text, id="clash-text", markup=False)
            yield Static(f"enter / f  launch as '{self.fresh}' (a fresh name)\n"
                         f"s          launch into '{self.profile_name}' anyway\n"
                         f"esc        do not launch", id="clash-choices", markup=False)
        yield Footer()

    def action_answer(self, answer: str | None) -> None:
        self.dismiss(answer)


class PathScreen(ModalScreen["Path | None"]):
    """Ask for a file path; optionally list existing .toml files in a folder to pick from.

    Enter in the input (or on a listed file) accepts; escape cancels. The caller may call
    :meth:`show_error` and keep the dialog open (e.g. a profile that does not validate).
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str, browse: Path | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.browse = browse

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Input(self.default, id="path")
            if self.browse is not None:
                files = sorted(self.browse.glob("*.toml")) if self.browse.is_dir() else []
                yield Label(f"profiles in {self.browse}/ (tab, then enter to pick)" if files
                            else f"no .toml files in {self.browse}/", classes="hint")
                if files:
                    yield OptionList(*[str(f) for f in files], id="files")
            yield Static("", id="path-error", classes="error")
        yield Footer()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._accept(event.value)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.query_one("#path", Input).value = str(event.option.prompt)
        self._accept(str(event.option.prompt))

    def _accept(self, value: str) -> None:
        value = value.strip()
        if not value:
            self.show_error("give a path")
            return
        self.dismiss(Path(value).expanduser())

    def show_error(self, text: str) -> None:
        self.query_one("#path-error", Static).update(text)

    def action_cancel(self) -> None:
        self.dismiss(None)
