"""``ssm-workbench serve``: the TUI in a web browser, through textual-serve.

textual-serve runs a small aiohttp web server; every browser tab that opens the page gets
its own TUI process (``python -m workbench.tui.app --store DIR --profiles DIR``) whose
screen is streamed over a websocket. Closing the tab ends that TUI, never the runs: workers
are detached, as with the terminal TUI.

The server has no authentication: whoever reaches the port drives the TUI (and can start
or kill runs). So it binds to 127.0.0.1 by default and refuses any address that is not
loopback unless ``--allow-remote`` is given, and then it warns. The intended way in from
another machine is SSH port forwarding (``ssh -L 8000:127.0.0.1:8000 host``).
"""
from __future__ import annotations

import errno
import ipaddress
import shlex
import socket
import sys
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def add_parser(sub) -> None:
    """Add the ``serve`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("serve", help="the TUI in a web browser (textual-serve; 127.0.0.1 by default, no authentication)",
                       description="Serve the TUI to a web browser (each tab gets its own TUI over the store). "
                                   "No authentication: it listens on 127.0.0.1 unless --allow-remote; from "
                                   "another machine use SSH port forwarding: ssh -L 8000:127.0.0.1:8000 HOST")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; a non-loopback one needs --allow-remote)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host: anyone who can reach it controls the workbench")
    p.add_argument("--profiles-dir", default="profiles", help="folder for saved profiles (default ./profiles)")
    p.add_argument("--public-url",
                   help="URL the browser uses to reach this server (default http://HOST:PORT); "
                        "set it when a proxy or a different forwarded port sits in between")
    p.set_defaults(fn=cmd_serve)


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback addresses (127.0.0.0/8, ::1); a host name other
    than localhost counts as remote, as it may resolve to anything."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def app_command(store_root: Path, profiles_dir: Path) -> str:
    """The shell command textual-serve runs for each browser session (it goes through a
    shell, hence the quoting). The running interpreter, so the TUI gets this environment."""
    return " ".join(shlex.quote(part) for part in (
        sys.executable, "-m", "workbench.tui.app",
        "--store", str(store_root), "--profiles", str(profiles_dir)))


def default_public_url(host: str, port: int) -> str:
    """Where the page tells the browser to open its websocket. A wildcard bind address is
    no address a browser can use, so the machine's name stands in for it."""
    host = host.strip().strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _forward_target(host: str) -> str:
    """The address an SSH tunnel on this machine should connect to for ``host``."""
    h = host.strip().strip("[]")
    return f"[{h}]" if ":" in h and is_loopback(h) else "127.0.0.1"


def port_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port, or None. Binding the way asyncio's
    server does (SO_REUSEADDR, IPv6 sockets v6-only) before textual-serve starts gives a
    clear message instead of a traceback after its banner."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot resolve --host {host!r}: {e.strerror}"
    bound = 0
    for family, type_, proto, _, addr in infos:
        with socket.socket(family, type_, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
                s.listen()
                bound += 1
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return f"port {port} on {host} is already in use; pick another with --port"
                if e.errno == errno.EADDRNOTAVAIL:
                    continue  # asyncio skips such an address too (e.g. ::1 with IPv6 off)
                return f"cannot listen on {host}:{port}: {e.strerror}"
    return None if bound else f"cannot listen on {host}:{port}: address not available on this machine"


def _serve(command: str, host: str, port: int, public_url: str) -> None:
    """Run textual-serve until Ctrl-C / SIGTERM (tests replace this)."""
    from textual_serve.server import Server  # lazily: only this command needs aiohttp

    Server(command, host=host, port=port, title="ssm-workbench", public_url=public_url).serve()


def cmd_serve(args) -> int:
    from workbench.store import Store

    err = sys.stderr
    if not 0 < args.port < 65536:
        print(f"serve: --port must be 1-65535, got {args.port}", file=err)
        return 2
    if not is_loopback(args.host):
        if not args.allow_remote:
            print(f"serve: refusing to listen on {args.host!r}: the browser view has no authentication, "
                  "so anyone who reaches it controls the workbench. Use SSH port forwarding "
                  f"(ssh -L {args.port}:127.0.0.1:{args.port} HOST) or pass --allow-remote to accept the risk.",
                  file=err)
            return 2
        print(f"serve: WARNING: listening on {args.host} with no authentication; anyone who can reach "
              f"port {args.port} can start and kill runs.", file=err)
    try:
        import textual_serve  # noqa: F401  (checked here so a missing package is one line, not a traceback)
    except ImportError:
        print("serve: textual-serve is not installed (pip install textual-serve)", file=err)
        return 2
    problem = port_problem(args.host, args.port)
    if problem:
        print(f"serve: {problem}", file=err)
        return 2

    store = Store(args.store) if args.store else Store()
    command = app_command(store.root, Path(args.profiles_dir).resolve())
    url = args.public_url or default_public_url(args.host, args.port)
    print(f"ssm-workbench in the browser: {url}  (store {store.root}; Ctrl-C stops the server, not the runs)")
    print(f"From another machine: ssh -L {args.port}:{_forward_target(args.host)}:{args.port} "
          f"{socket.gethostname()}, then open http://127.0.0.1:{args.port}", flush=True)
    try:
        _serve(command, args.host, args.port, url)
    except OSError as e:  # lost a race for the port since the check
        print(f"serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=err)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
