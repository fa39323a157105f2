"""The Textual TUI: a sweep form, a live runs table and a per-run view.

Start it with ``ssm-workbench`` (or ``python -m workbench.tui.app --store DIR``). It only
reads the store (plus submit/kill through :mod:`workbench.execute.launch`), so quitting it
leaves detached workers running and reopening it shows them again.
"""
