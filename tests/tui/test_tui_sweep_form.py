"""Pilot tests of the sweep form's model picker (filter, family headers, picks that survive
the filter, loading a profile) and of the run count the form shows while it is edited."""
from __future__ import annotations

import threading

import models
from textual.widgets import Input, Static

from test_tui import SIZE, FakeScheduler, fill_form, make_app, settle, store, tiny_profile, type_into  # noqa: F401
from workbench.spec import profile as profiles
from workbench.tui.model_picker import Entry, ModelPicker, matches
from workbench.tui.sweep_form import SweepForm


class HeldScheduler(FakeScheduler):
    """Submits once ``hold`` (when set to an Event) is set."""

    hold: threading.Event | None = None

    def submit(self, store, profile, jobs=None):
        if self.hold is not None:
            self.hold.wait(10)
        return super().submit(store, profile, jobs)


def by_hand(query: str) -> set[str]:
    """The models a filter must show, worked out without the picker."""
    words = query.lower().split()
    return {n for n in models.names()
            if all(w in f"{n} {models.entry(n).family} {models.describe(n)}".lower() for w in words)}


async def open_form(pilot) -> tuple[SweepForm, ModelPicker]:
    await pilot.press("f2")
    await pilot.pause()
    return pilot.app.query_one(SweepForm), pilot.app.query_one("#models", ModelPicker)


def text(widget) -> str:
    return str(widget.render())


def summary(picker: ModelPicker) -> str:
    return text(picker.query_one("#models-picked", Static))


def headers(picker: ModelPicker) -> list[str]:
    return [o.value[1] for o in picker.query_one("#models-list").options if o.disabled]


def run_count(form: SweepForm) -> str:
    return text(form.query_one("#run-count", Static))


def test_matches_every_word_in_name_family_or_description():
    e = Entry("mamba_s4d_lin", "ssm", "Mamba block with inner S4D-Lin")
    assert matches("", e) and matches("MAMBA", e) and matches("ssm lin", e)
    assert matches("s4d-lin block", e)  # words may match different fields
    assert not matches("mamba attention", e)  # every word must match


async def test_typing_a_filter_narrows_the_list(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        _, picker = await open_form(pilot)
        every = picker.shown
        assert sorted(every) == models.names()
        for query in ("s4d lin", "attention", "LSTM"):
            await type_into(pilot, "#models-filter", query)
            await pilot.pause()
            assert set(picker.shown) == by_hand(query) and len(picker.shown) < len(every), query
            # a header for each family shown, and for no other
            assert headers(picker) == list(dict.fromkeys(models.entry(n).family for n in picker.shown))
            assert f"{len(picker.shown)} of {len(every)} models shown" in summary(picker)
        assert picker.shown == ["lstm"]
        assert "transformer" in by_hand("attention")  # by family (its description says Transformer)

        await type_into(pilot, "#models-filter", "nothing like this")
        await pilot.pause()
        assert picker.shown == [] and "no model matches" in summary(picker)
        await pilot.press("escape")  # clears the filter
        await pilot.pause()
        assert picker.filter_input.value == "" and picker.shown == every


async def test_a_pick_survives_filtering_and_is_launched(store, tmp_path):
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        _, picker = await open_form(pilot)
        await type_into(pilot, "#models-filter", "lstm")
        await pilot.press("down", "space")  # from the filter into the list; pick
        assert picker.picked == ["lstm"]

        await type_into(pilot, "#models-filter", "mamba_s6")
        await pilot.pause()
        assert picker.shown == ["mamba_s6"]
        assert picker.picked == ["lstm"]  # hidden, still picked
        assert "1 picked: lstm" in summary(picker) and "1 hidden by the filter" in summary(picker)
        await pilot.press("down", "space")
        assert picker.picked == ["lstm", "mamba_s6"]

        await type_into(pilot, "#models-filter", "lstm")  # back in view, still checked
        await pilot.pause()
        assert picker.query_one("#models-list").selected == ["lstm"]
        await type_into(pilot, "#models-filter", "transformer")  # both hidden at launch
        app.query_one("#seq_lens", Input).value = "40"
        await pilot.press("ctrl+r")
        await settle(pilot)
        [launched] = sched.submitted
        assert launched.sweep.models == ["lstm", "mamba_s6"]


async def test_family_headers_cannot_be_picked(store, tmp_path):
    sched = FakeScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        form, picker = await open_form(pilot)
        lst = picker.query_one("#models-list")
        picker.focus()
        await pilot.pause()
        # down walks every model and never stops on a header; space and enter pick (each in
        # turn, on the first model under each family's header and on the last model: a pick
        # is ~0.2 s of CPU, and the walk already shows every other stop is a model)
        seen, picks = [], []
        for i in range(len(models.names())):
            option = lst.highlighted_option
            assert option is not None and option.value in models.names(), f"cursor on {option.prompt}"
            seen.append(option.value)
            if i in (0, len(models.names()) - 1) or models.entry(seen[-1]).family != models.entry(seen[-2]).family:
                await pilot.press("space" if len(picks) % 2 else "enter")
                picks.append(option.value)
            await pilot.press("down")
        assert sorted(dict.fromkeys(seen)) == models.names()
        assert len(picks) > 2 and picker.picked == [n for n in models.names() if n in picks]
        assert all(isinstance(v, str) for v in lst.selected)  # no header among them
        assert sched.submitted == []  # enter toggled; it launched nothing

        # a click on a header picks nothing (a click on a model does)
        picker.set_picked([])
        await type_into(pilot, "#models-filter", "lstm")
        await pilot.pause()
        await pilot.click("#models-list", offset=(6, 0))  # "rnn (1)"
        assert picker.picked == []
        await pilot.click("#models-list", offset=(6, 1))
        assert picker.picked == ["lstm"]
        picker.set_picked(["rnn", "lstm"])  # a family is no model
        assert picker.picked == ["lstm"]

        # up from the first model goes back to the filter rather than onto its header
        picker.focus()
        await pilot.pause()
        await pilot.press("up")
        assert app.focused is picker.filter_input

        # a sweep without models: the message is shown and the focus goes to the picker
        picker.set_picked([])
        app.query_one("#name", Input).focus()
        assert form.build_profile() is None
        await pilot.pause()
        assert "at least 1" in text(form.query_one("#err-models", Static))
        assert app.focused is lst


async def test_run_count_follows_models_lengths_and_seeds(store, tmp_path):
    sched = HeldScheduler()
    app = make_app(store, tmp_path, sched)
    async with app.run_test(size=SIZE) as pilot:
        form, picker = await open_form(pilot)
        assert "pick at least one model" in run_count(form)
        picker.set_picked(["lstm", "transformer"])
        await pilot.pause()
        assert run_count(form) == "will launch 2 runs = 2 models x 1 length x 1 seed"
        await type_into(pilot, "#seq_lens", "40, 48, 64")
        assert run_count(form) == "will launch 6 runs = 2 models x 3 lengths x 1 seed"
        await type_into(pilot, "#seeds", "0, 1")
        assert run_count(form) == "will launch 12 runs = 2 models x 3 lengths x 2 seeds"
        await type_into(pilot, "#models-filter", "hyena")
        await pilot.press("down", "space")  # a third model, picked with the keys
        assert len(picker.picked) == 3
        assert run_count(form) == "will launch 18 runs = 3 models x 3 lengths x 2 seeds"

        # what keeps it from being counted
        await type_into(pilot, "#seeds", "0, x")
        assert "cannot count" in run_count(form) and "seeds ('x')" in run_count(form)
        await type_into(pilot, "#seeds", "")
        assert "at least one of the seeds" in run_count(form)
        await type_into(pilot, "#seeds", "3")
        await type_into(pilot, "#seq_lens", "")  # no lengths: the task's own
        assert run_count(form) == "will launch 3 runs = 3 models x 1 length (the task's default) x 1 seed"

        # launching says how many runs, and the sweep launched has that many
        await type_into(pilot, "#seq_lens", "40, 48")
        assert run_count(form).startswith("will launch 6 runs")
        sched.hold = threading.Event()  # the status is read while the launch is under way
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert text(form.query_one("#form-status", Static)) == \
            "launching 6 runs = 3 models x 2 lengths x 1 seed"
        sched.hold.set()
        await settle(pilot)
        [launched] = sched.submitted
        assert len(profiles.expand(launched)) == 6


async def test_loading_a_profile_sets_the_picks(store, tmp_path):
    path = profiles.save(tiny_profile("loadme", models=("transformer", "lstm"), seq_lens=(40, 48)),
                         tmp_path / "loadme.toml")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form, picker = await open_form(pilot)
        picker.set_picked(["hyena"])  # replaced by the profile's
        await type_into(pilot, "#models-filter", "mamba")  # hides both of the profile's models
        await pilot.press("ctrl+o")
        await pilot.pause()
        app.screen.query_one("#path", Input).value = str(path)
        await pilot.press("enter")
        await settle(pilot)
        assert picker.picked == ["lstm", "transformer"]
        assert "2 picked: lstm, transformer" in summary(picker) and "2 hidden" in summary(picker)
        assert run_count(form) == "will launch 4 runs = 2 models x 2 lengths x 1 seed"
        # the sweep keeps the profile's model order (the order its runs go in)
        assert form.build_profile().sweep.models == ["transformer", "lstm"]
        picker.focus()
        await pilot.press("escape")
        await pilot.pause()
        assert sorted(picker.query_one("#models-list").selected) == ["lstm", "transformer"]


async def test_executor_and_slurm_settings(store, tmp_path):
    """The form's Where section: executor and #SBATCH settings go into the profile, bad
    settings show next to their field, and a loaded Slurm profile fills them back."""
    from textual.widgets import Select, Static

    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form = await fill_form(pilot, tiny_profile())
        assert form.build_profile().executor == "local"
        form.query_one("#executor", Select).value = "slurm"
        await type_into(pilot, "#slurm", 'partition=gpu, time=04:00:00, gpus_per_run=2, extra=["--exclusive"]')
        prof = form.build_profile()
        assert prof.executor == "slurm" and prof.slurm.partition == "gpu"
        assert prof.slurm.time == "04:00:00" and prof.slurm.gpus_per_run == 2 and prof.slurm.extra == ["--exclusive"]
        await type_into(pilot, "#slurm", "time=soon")
        assert form.build_profile() is None
        assert "HH:MM:SS" in str(form.query_one("#err-slurm", Static).render())
        # load -> the fields; save -> the same settings
        await form.fill(prof)
        await settle(pilot)
        assert form.query_one("#executor", Select).value == "slurm"
        again = form.build_profile()
        assert again.slurm == prof.slurm and again.executor == "slurm"


async def test_loading_an_evaluation_profile_opens_it_in_the_evaluation_form(store, tmp_path, monkeypatch):  # noqa: F811
    from pathlib import Path

    from textual.widgets import TabbedContent

    from test_lm_eval_tasks import fake_index
    from workbench.tui.eval_form import EvalForm

    fake_index(monkeypatch)  # the evaluation form checks the task names: not against lm-eval's real index
    path = Path(__file__).resolve().parents[2] / "profiles" / "zero-shot-table3.toml"
    assert profiles.is_eval_data(profiles.tomllib.loads(path.read_text()))  # an [eval] table
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        form, picker = await open_form(pilot)
        picker.set_picked(["hyena"])
        before = form.form_data()
        await pilot.press("ctrl+o")
        await pilot.pause()
        app.screen.query_one("#path", Input).value = str(path)
        await pilot.press("enter")
        await settle(pilot)
        assert app.query_one(TabbedContent).active == "eval"  # the evaluation form (F4) has it
        ev = app.query_one(EvalForm)
        assert ev.query_one("#ev-name", Input).value == "zero-shot-table3"
        assert f"loaded {path}" in str(ev.query_one("#eval-status", Static).render())
        assert picker.picked == ["hyena"] and form.form_data() == before  # the sweep form is unchanged
        assert not app.scheduler.submitted