"""``ssm-workbench serve``: the host check and arguments (units), and the TUI in a real
headless Chromium (Debian's ``chromium`` driven by Playwright; no browser is downloaded),
checked on screenshots compared as pictures."""
from __future__ import annotations

import argparse
import io
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from workbench.spec import profile as profiles
from workbench.cli import serve
from workbench.store import Store

ROOT = Path(__file__).resolve().parents[3]


def parse(*argv: str) -> argparse.Namespace:
    """Parse as the CLI does: a global --store, then the serve subcommand."""
    ap = argparse.ArgumentParser(prog="ssm-workbench")
    ap.add_argument("--store")
    serve.add_parser(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(list(argv))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(monkeypatch):
    """Replaces the real server: records what it would have served."""
    calls: list[dict] = []
    monkeypatch.setattr(serve, "_serve", lambda command, host, port, public_url: calls.append(
        dict(command=command, host=host, port=port, public_url=public_url)))
    return calls


# --------------------------------------------------------------------------- units
@pytest.mark.parametrize("host", ["127.0.0.1", "127.4.5.6", "::1", "[::1]", "localhost", "LocalHost"])
def test_loopback_hosts(host):
    assert serve.is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.org", "localhost.evil.org"])
def test_remote_hosts(host):
    assert not serve.is_loopback(host)


def test_defaults():
    args = parse("serve")
    assert (args.host, args.port, args.allow_remote, args.profiles_dir, args.public_url) == \
        ("127.0.0.1", 8000, False, "profiles", None)
    assert args.fn is serve.cmd_serve


def test_remote_host_refused_without_flag(served, tmp_path, capsys):
    rc = serve.cmd_serve(parse("--store", str(tmp_path), "serve", "--host", "0.0.0.0", "--port", str(free_port())))
    err = capsys.readouterr().err
    assert rc == 2 and not served
    assert "refusing" in err and "--allow-remote" in err and "ssh -L" in err


def test_remote_host_with_flag_warns(served, tmp_path, capsys):
    port = free_port()
    rc = serve.cmd_serve(parse("--store", str(tmp_path), "serve", "--host", "0.0.0.0", "--port", str(port),
                               "--allow-remote", "--public-url", "http://box.example:9000"))
    err = capsys.readouterr().err
    assert rc == 0 and "WARNING" in err and "no authentication" in err
    assert served == [dict(command=served[0]["command"], host="0.0.0.0", port=port,
                           public_url="http://box.example:9000")]


def test_loopback_serves_the_tui_over_the_store(served, tmp_path, capsys, monkeypatch):
    store = tmp_path / "my store"  # a space: the command goes through a shell
    monkeypatch.chdir(tmp_path)
    port = free_port()
    rc = serve.cmd_serve(parse("--store", str(store), "serve", "--port", str(port), "--profiles-dir", "profs"))
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    [call] = served
    assert (call["host"], call["port"], call["public_url"]) == ("127.0.0.1", port, f"http://127.0.0.1:{port}")
    assert shlex.split(call["command"]) == [sys.executable, "-m", "workbench.tui.app", "--store", str(store),
                                            "--profiles", str(tmp_path / "profs")]
    assert f"http://127.0.0.1:{port}" in out and f"ssh -L {port}:127.0.0.1:{port} " in out


def test_store_from_environment(served, store_dir, capsys):
    assert serve.cmd_serve(parse("serve", "--port", str(free_port()))) == 0
    assert shlex.split(served[0]["command"])[4] == str(store_dir)


def test_port_in_use_is_a_clear_error(served, tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = serve.cmd_serve(parse("--store", str(tmp_path), "serve", "--port", str(port)))
    err = capsys.readouterr().err
    assert rc == 2 and not served
    assert f"port {port}" in err and "in use" in err and "Traceback" not in err


def test_bad_port(served, tmp_path, capsys):
    assert serve.cmd_serve(parse("--store", str(tmp_path), "serve", "--port", "70000")) == 2
    assert "--port" in capsys.readouterr().err and not served


# --------------------------------------------------------------------------- in a browser
# Screenshots are compared as pictures: the share of pixels whose colour moved by more than
# DELTA in some channel. A blinking cursor is one cell (about 0.02% of the page), far below
# every threshold used here.
DELTA = 48
VIEWPORT = {"width": 1200, "height": 800}
MIN_DRAWN = 0.005  # share of pixels off the background colour: text of a drawn TUI is >1%, the loading screen 0.1%


def picture(png: bytes):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)


def changed(a, b):
    """Boolean mask of the pixels that differ between two screenshots."""
    return (abs(a - b).max(axis=2) > DELTA)


def diff(a, b) -> float:
    return float(changed(a, b).mean())


def drawn(a) -> float:
    """Share of pixels away from the most common colour (the background)."""
    import numpy as np

    packed = (a[..., 0].astype(np.int32) << 16) | (a[..., 1].astype(np.int32) << 8) | a[..., 2]
    values, counts = np.unique(packed, return_counts=True)
    v = int(values[counts.argmax()])
    background = np.array([v >> 16, (v >> 8) & 255, v & 255], dtype=np.int16)
    return float(changed(a, background[None, None, :]).mean())


def settled(page, what: str, since=None, min_change: float = 0.003, timeout: float = 20.0):
    """Screenshots until two in a row agree (the terminal has finished drawing), and until
    the picture is drawn (not one flat colour) and, with ``since``, has moved away from that
    one first. The last one is kept as ``<what>.png`` beside the test's files."""
    deadline = time.monotonic() + timeout
    prev, cur = None, None
    while time.monotonic() < deadline:
        cur = picture(page.screenshot())
        ready = drawn(cur) > MIN_DRAWN and (since is None or diff(cur, since) > min_change)
        if ready and prev is not None and diff(cur, prev) < 0.001:
            break
        prev = cur if ready else None
        time.sleep(0.25)
    else:
        keep(page, what)
        raise AssertionError(f"{what}: the page did not settle: {drawn(cur):.2%} drawn"
                             + ("" if since is None else f", {diff(cur, since):.2%} changed"))
    keep(page, what, cur)
    return cur


def keep(page, what: str, pic=None) -> None:
    """Save a screenshot for whoever reads a failure (the folder is in page.keep_dir)."""
    from PIL import Image

    folder = getattr(page, "keep_dir", None)
    if folder is not None:
        if pic is None:
            (folder / f"{what}.png").write_bytes(page.screenshot())
        else:
            Image.fromarray(pic.astype("uint8")).save(folder / f"{what}.png")


def open_tui(page, url: str, what: str):
    """Load the page, wait for the terminal, and click into it as a user does (keys go to the
    focused terminal; the app then shows its focused state)."""
    page.goto(url)
    loaded = settled(page, f"{what}-loaded")
    page.mouse.click(VIEWPORT["width"] // 2, VIEWPORT["height"] // 2)  # the empty table area
    # the click focuses the terminal and the app shows its focused table (cursor row, the
    # table's keys in the footer): wait for that change, not only for two equal frames (a
    # loaded machine answered the click after the picture had "settled")
    return settled(page, what, since=loaded)


def add_finished_run(store: Store) -> int:
    spec = profiles.expand(profiles.load(ROOT / "profiles" / "mad-selective-copying.toml"))[0]
    [rid] = store.add_runs([spec.to_dict()])
    store.mark_started(rid, os.getpid(), "cpu", "cpu0")
    store.finish(rid, "finished")
    return rid


def serve_command(store: Path, port: int) -> list[str]:
    """`ssm-workbench --store STORE serve --port PORT`, as a user types it."""
    return [sys.executable, "-m", "workbench.cli", "--store", str(store), "serve", "--port", str(port)]


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the server and the TUI processes it started (one process group), leaving none."""
    import psutil

    def alive():
        return [p for p in psutil.process_iter(["status"]) if _pgid(p.pid) == proc.pid
                and p.info["status"] != psutil.STATUS_ZOMBIE]

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive():
            break
    proc.wait(timeout=5)
    assert not alive(), "serve left processes behind"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tui_in_a_real_browser(tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does it as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) is not installed")
    pytest.importorskip("PIL", reason="Pillow is needed to compare screenshots")

    # The store starts empty, so the same app (same store path in its header) can be seen
    # without the run and with it; every page load starts a fresh TUI process.
    store = Store(tmp_path / "store")
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(serve_command(store.root, port), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"serve exited with {proc.returncode}:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    assert r.status == 200 and b"textual-terminal" in r.read()
                break
            except OSError:
                assert time.monotonic() < deadline, f"serve did not answer:\n{log.read_text()}"
                time.sleep(0.2)

        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium)  # the system's, never a download
            try:
                def new_page():
                    page = browser.new_page(viewport=VIEWPORT)
                    # the page asks Google for a web font: no network needed (or wanted) here
                    page.route("**/fonts.googleapis.com/**", lambda route: route.abort())
                    page.keep_dir = tmp_path  # screenshots for a failure's reader
                    return page

                # (a) the page loads and the TUI is drawn: far from one flat colour
                first = new_page()
                empty = open_tui(first, url, "empty")
                assert drawn(empty) > MIN_DRAWN, "the page looks blank"  # (settled waited for it)

                # (b) a finished run in the store appears in the runs table: live in the open
                # page (the app polls the store at 2 Hz), and in a new page's fresh TUI
                add_finished_run(store)
                live = settled(first, "live", since=empty)
                first.close()
                page = new_page()
                runs = open_tui(page, url, "runs")
                assert diff(live, runs) < 0.005, f"the live table and a fresh one differ (see {tmp_path})"
                moved = changed(empty, runs)
                top = moved[: moved.shape[0] // 4].mean() / 4  # share of the page, top quarter only
                assert top > 0.002, f"no run row in the table ({moved.mean():.2%} changed, {top:.2%} at the top)"

                # (c) F2 switches to the sweep form (much of the picture changes), F1 back
                page.keyboard.press("F2")
                sweep = settled(page, "after-F2", since=runs)
                assert diff(runs, sweep) > 0.03, f"F2 changed only {diff(runs, sweep):.2%} of the page"
                page.keyboard.press("F1")
                back = settled(page, "after-F1", since=sweep)
                assert diff(runs, back) < 0.005, f"F1 did not come back ({diff(runs, back):.2%} differs)"
            finally:
                browser.close()
    finally:
        stop_group(proc)
