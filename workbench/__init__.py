"""ssm-workbench: compare sequence models from a terminal.

Parts: ``profile`` (validated TOML sweeps), ``store`` (SQLite, the single source of
truth), ``scheduler`` + ``worker`` (background training processes), ``export``
(comparison tables), ``tui`` (the Textual app), ``cli`` (the ``ssm-workbench`` command).
"""
__version__ = "0.1.0"
