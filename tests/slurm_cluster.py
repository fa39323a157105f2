"""A real one-node Slurm cluster for tests: munged + slurmctld + slurmd, path-isolated.

``SlurmCluster(tmp_dir)`` writes a slurm.conf and a fresh munge key under ``tmp_dir``,
starts the three daemons as children of this process on free ports, waits until ``sinfo``
shows the node idle, and on exit cancels every job and stops everything it started. Clients
(``sbatch``, ``squeue``, ``scontrol``, ``scancel``, ``srun``, ``sinfo``) find this cluster
through ``cluster.env`` (a copy of ``os.environ`` with ``SLURM_CONF`` set), so a system-wide
Slurm or munge on the same machine is never touched and never used.

Why it is built the way it is (all of it found out on Debian 12, Slurm 22.05.8, munge 0.5.15,
as root, without systemd):

* Every path the daemons use is under ``tmp_dir`` (state, spool, logs, pid files, the key),
  except munge's socket: munged refuses a socket whose directory or any ancestor is not
  executable by all ("Socket is inaccessible: execute permissions for all required"), and
  pytest's temporary folders are 0700; a Unix socket path is also limited to 108 bytes.
  So the socket lives in a short ``/tmp/ssmwb-slurm-XXXX`` folder (0755) removed on stop.
  Slurm finds that socket through ``AuthInfo=socket=...`` in slurm.conf (daemons and
  clients alike), so no client needs anything but ``SLURM_CONF``.
* The ports are chosen free at start, so a leftover cluster of a crashed session (or a
  system one on 6817/6818) cannot collide with this one.
* Every daemon is started with two marker variables in its environment
  (``SSMWB_SLURM_CLUSTER``: this cluster's folder; ``SSMWB_SLURM_OWNER``: pid and start
  time of the process that started it). slurmd hands its environment to each
  ``slurmstepd``, and ``cluster.env`` carries the markers into every job submitted with it.
  ``stop()`` kills whatever still carries this cluster's marker (slurmstepd double-forks
  away from slurmd, so killing slurmd alone would leave steps and their jobs running), and
  ``start()`` first kills processes of earlier clusters whose owner is dead (a test session
  killed with SIGKILL never ran its ``stop()``).
* No accounting (``AccountingStorageType=accounting_storage/none``): ``sacct`` does not
  work. Job states come from ``squeue -t all`` (``squeue`` alone hides finished jobs) and
  ``scontrol show job -o``, which keep a finished job for ``MinJobAge`` seconds (300 here).
* ``AuthInfo=...,cred_expire=N`` is also the delay before a requeued job may start again
  (Slurm's default is 120 s; here 10 s so requeue tests stay quick).
* ``SlurmdParameters=config_overrides`` lets the node claim more CPUs than the machine has
  (``cpus=``), so several 1-CPU jobs can run at once on a 2-core CI machine.
* Two partitions: ``debug`` (default) and ``urgent``, a higher ``PriorityTier`` that
  preempts ``debug`` jobs (``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``),
  so tests can provoke a real preemption.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# Binaries the cluster needs: the three daemons and the clients tests use.
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")

MARK_CLUSTER = "SSMWB_SLURM_CLUSTER"
MARK_OWNER = "SSMWB_SLURM_OWNER"

# Job states after which a job never runs again (unless requeued by hand).
FINISHED_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
})


def which(name: str) -> str | None:
    """The binary's path: on PATH, or in the sbin folders Debian puts the daemons in (a
    non-login root shell, as in some CI runners, may not have them on PATH)."""
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def unavailable_reason() -> str | None:
    """Why a real cluster cannot be started here, or None when it can."""
    if platform.system() != "Linux":
        return "a Slurm test cluster needs Linux"
    if os.geteuid() != 0:
        # SlurmUser=root, slurmd must run as root to start jobs, munged's key is root's.
        return "a Slurm test cluster needs root (slurmd starts jobs as root)"
    missing = [b for b in DAEMONS + CLIENTS if which(b) is None]
    if missing:
        return ("Slurm/munge not installed (missing " + ", ".join(missing) + "); on Debian: "
                "apt-get install slurmctld slurmd slurm-client munge")
    return None


def _free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), which tells a
    live owner from a new process that reused its pid; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _marked_processes() -> dict[int, dict[str, str]]:
    """pid -> environment of every process carrying a test-cluster marker."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            env = _environ(int(entry))
            if MARK_CLUSTER in env:
                found[int(entry)] = env
    return found


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_orphaned_clusters() -> list[int]:
    """SIGKILL the daemons, steps and jobs of earlier test clusters whose owner process is
    gone (a crashed or killed test session) and remove their socket folders; returns the
    pids killed. Clusters of live owners (another pytest session, an xdist worker) are
    left alone."""
    stale = []
    for pid, env in _marked_processes().items():
        owner_pid, _, owner_start = env.get(MARK_OWNER, "").partition(":")
        if not owner_pid.isdigit() or _start_time(int(owner_pid)) != owner_start:
            stale.append(pid)
    _kill_all(stale)
    # And their munge socket folders in /tmp (each holds its owner's mark).
    for d in Path("/tmp").glob("ssmwb-slurm-*"):
        try:
            owner_pid, _, start = (d / "owner").read_text().partition(":")
        except OSError:
            continue
        if not owner_pid.isdigit() or _start_time(int(owner_pid)) != start:
            shutil.rmtree(d, ignore_errors=True)
    return stale


def _node_hardware() -> dict[str, int]:
    """CPUs, sockets, cores, threads and memory (MiB) as slurmd itself sees them
    (``slurmd -C``), so the node is not drained for claiming more than it has."""
    hw = {}
    try:
        out = subprocess.run([which("slurmd") or "slurmd", "-C"], capture_output=True,
                             text=True, timeout=30).stdout
        hw = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", out)}
    except (OSError, subprocess.SubprocessError):
        pass
    if "CPUs" not in hw or "RealMemory" not in hw:
        mem_kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        hw = {"CPUs": os.cpu_count() or 1, "RealMemory": mem_kib // 1024}
    return hw


class SlurmClusterError(RuntimeError):
    pass


class SlurmCluster:
    """A one-node Slurm cluster under ``tmp_dir``; use as a context manager (or call
    ``start()`` / ``stop()``).

    Attributes after start: ``env`` (environment for Slurm clients and jobs), ``conf_path``,
    ``node`` (the node name: this host's short name), ``partition`` (the default one),
    ``urgent_partition`` (preempts the default one), ``node_cpus``, ``jobs_dir`` (a folder
    for job output), ``startup_s`` (seconds from launching the daemons to the node being idle).
    """

    partition = "debug"
    urgent_partition = "urgent"

    def __init__(self, tmp_dir, *, cpus: int | None = None, min_job_age: int = 300,
                 requeue_delay: int = 10, slurmd_timeout: int = 10,
                 start_timeout: float = 60.0, extra_conf: str = ""):
        """``cpus``: CPUs the node claims (default: the real count; more lets more 1-CPU
        jobs run side by side). ``min_job_age``: seconds a finished job stays visible to
        squeue/scontrol. ``requeue_delay``: seconds before a requeued job may start again
        (Slurm's cred_expire, at least 5). ``slurmd_timeout``: seconds without an answer
        from slurmd before the node is DOWN and its jobs NODE_FAIL. ``extra_conf``: lines
        appended to slurm.conf."""
        self.base = Path(tmp_dir).resolve()
        self.cpus = cpus
        self.min_job_age = min_job_age
        self.requeue_delay = max(5, requeue_delay)
        self.slurmd_timeout = slurmd_timeout
        self.start_timeout = start_timeout
        self.extra_conf = extra_conf
        self.node = socket.gethostname().split(".")[0]
        self.conf_path = self.base / "etc" / "slurm.conf"
        self.log_dir = self.base / "log"
        self.jobs_dir = self.base / "jobs"
        self.sock_dir: Path | None = None
        self.env: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.startup_s: float | None = None
        self.node_cpus: int | None = None   # CPUs the node offers, set when the conf is written

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "SlurmCluster":
        reason = unavailable_reason()
        if reason:
            raise SlurmClusterError(reason)
        kill_orphaned_clusters()
        # A fresh controller state: no jobs or node state recovered from an earlier start.
        for sub in ("state", "spool"):
            shutil.rmtree(self.base / sub, ignore_errors=True)
        for sub in ("etc", "munge", "state", "spool", "log", "jobs"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "munge").chmod(0o700)
        # Short, world-traversable folder for munge's socket (see the module docstring).
        self.sock_dir = Path(tempfile.mkdtemp(prefix="ssmwb-slurm-", dir="/tmp"))
        self.sock_dir.chmod(0o755)
        (self.sock_dir / "owner").write_text(self._owner_mark())

        # munged wants a key of at least 32 bytes, readable by its user only.
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)

        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = _free_port()
        self.conf_path.write_text(self.slurm_conf())

        self.env = self._client_env()
        t0 = time.monotonic()
        try:
            self._launch("munged", [
                which("munged"), "--foreground", f"--socket={self.munge_socket}",
                f"--key-file={key}", f"--log-file={self.log_dir / 'munged.log'}",
                f"--pid-file={self.sock_dir / 'munged.pid'}",
                f"--seed-file={self.base / 'munge' / 'munged.seed'}",
            ])
            self._wait(lambda: self.munge_socket.exists(), 15, "munged to create its socket")
            # -D: stay in the foreground, so the Popen object is the daemon itself.
            self._launch("slurmctld", [which("slurmctld"), "-D", "-f", str(self.conf_path)])
            self._launch("slurmd", self._slurmd_argv())
            self._wait(lambda: self.node_state() == "idle", self.start_timeout,
                       f"node {self.node} to be idle in sinfo")
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill any step or job process left with this
        cluster's marker, remove the socket folder. Safe to call twice."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            try:
                self.cancel_all()
            except (OSError, subprocess.SubprocessError, SlurmClusterError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for _ in range(20):   # steps and jobs slurmd left behind, and their children
            pids = [p for p, env in _marked_processes().items()
                    if env.get(MARK_CLUSTER) == str(self.base)]
            if not pids:
                break
            _kill_all(pids)
            time.sleep(0.1)
        self.procs = {}
        if self.sock_dir is not None:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
            self.sock_dir = None

    def cancel_all(self, timeout: float = 20) -> None:
        """scancel every job not yet finished and wait (up to ``timeout``) until none runs,
        so the next test that shares this cluster starts on an idle node."""
        ids = self.job_ids()
        if ids:
            self.run("scancel", *ids, check=False, timeout=15)
            self._wait(lambda: not self.job_ids("R,CG,S,CF"), timeout, "jobs to end",
                       raise_=False)

    # -- configuration ---------------------------------------------------------------------

    @property
    def munge_socket(self) -> Path:
        return self.sock_dir / "munge.socket"

    def slurm_conf(self) -> str:
        """The slurm.conf text for this cluster (written to ``conf_path`` at start)."""
        hw = _node_hardware()
        real_cpus = hw["CPUs"]
        cpus = self.node_cpus = self.cpus or real_cpus
        if cpus == real_cpus and "CoresPerSocket" in hw:
            # The exact layout slurmd detects; a mismatch only logs a warning, but why have it.
            layout = (f"CPUs={cpus} Boards={hw.get('Boards', 1)} "
                      f"SocketsPerBoard={hw['SocketsPerBoard']} "
                      f"CoresPerSocket={hw['CoresPerSocket']} "
                      f"ThreadsPerCore={hw['ThreadsPerCore']}")
        else:
            layout = f"CPUs={cpus}"
        memory = max(256, int(hw["RealMemory"] * 0.9))   # a bit below: never "low memory" drained
        b = self.base
        return f"""\
# Written by tests/slurm_cluster.py: a one-node test cluster, every path under {b}.
ClusterName=ssmwb
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# socket: our munged, not the system one; cred_expire: also the requeued-job start delay.
AuthInfo=socket={self.munge_socket},cred_expire={self.requeue_delay}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool
SlurmctldPidFile={b}/state/slurmctld.pid
SlurmdPidFile={b}/spool/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups here (containers, gVisor): track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (defaults: 60 s main loop, 30 s backfill), so a requeued
# job starts soon after its BeginTime instead of up to a minute later.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
MaxJobCount=10000
SlurmctldTimeout=10
SlurmdTimeout={self.slurmd_timeout}
MinJobAge={self.min_job_age}
JobRequeue=1
KillWait=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 {layout} RealMemory={memory} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName={self.urgent_partition} Nodes={self.node} MaxTime=INFINITE State=UP PriorityTier=10
{self.extra_conf}
"""

    def _owner_mark(self) -> str:
        return f"{os.getpid()}:{_start_time(os.getpid())}"

    def _client_env(self) -> dict[str, str]:
        # Drop Slurm variables inherited from outside (a CI job that itself runs under
        # Slurm would otherwise point sbatch/squeue at the wrong job or cluster).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SRUN_", "SALLOC_", "SINFO_",
                                    "SCONTROL_", "SCANCEL_"))}
        env["SLURM_CONF"] = str(self.conf_path)
        env[MARK_CLUSTER] = str(self.base)
        env[MARK_OWNER] = self._owner_mark()
        return env

    def _slurmd_argv(self) -> list[str]:
        # -N: the node's name without relying on this host's name resolving.
        return [which("slurmd"), "-D", "-f", str(self.conf_path), "-N", self.node]

    def _launch(self, name: str, argv: list[str]) -> None:
        out = open(self.log_dir / f"{name}.stdout", "wb")
        self.procs[name] = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,   # Ctrl-C in the test terminal must not hit the daemons
        )
        out.close()

    def _wait(self, ok, timeout: float, what: str, raise_: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ok():
                    return True
            except (OSError, subprocess.SubprocessError):
                pass
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if time.monotonic() > deadline or (dead and raise_):
                if not raise_:
                    return False
                why = f"daemon(s) {', '.join(dead)} exited" if dead else f"{timeout:.0f} s passed"
                raise SlurmClusterError(f"Slurm test cluster: waited for {what}, but {why}.\n"
                                        + self.logs())
            time.sleep(0.2)

    # -- observing -------------------------------------------------------------------------

    def logs(self, lines: int = 25) -> str:
        """The last lines of every daemon log (for failure messages)."""
        parts = []
        for f in sorted(self.log_dir.glob("*")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {f.name} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    def run(self, *argv: str, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client against this cluster; raises with its stderr when it fails."""
        res = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                             timeout=timeout)
        if check and res.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} exited {res.returncode}: "
                                    f"{res.stderr.strip() or res.stdout.strip()}")
        return res

    def node_state(self) -> str:
        """The node's state as sinfo prints it: idle, alloc, mix, down*, drain, ..."""
        # One line per partition the node is in, all alike: take the first.
        out = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%t", timeout=10).stdout
        return out.split()[0] if out.split() else ""

    def sbatch(self, *args: str, script: str | None = None) -> str:
        """Submit a batch job (``args`` are sbatch options, e.g. ``--wrap=...``, or a
        ``script`` text piped on stdin); returns the job id. Submitted from ``jobs_dir``,
        so a job without ``--output`` writes its default slurm-%j.out there, not into the
        current directory."""
        res = subprocess.run(["sbatch", "--parsable", *args], env=self.env, input=script,
                             capture_output=True, text=True, timeout=30, cwd=self.jobs_dir)
        if res.returncode != 0:
            raise SlurmClusterError(f"sbatch {' '.join(args)} exited {res.returncode}: "
                                    f"{res.stderr.strip()}")
        return res.stdout.strip().split(";")[0]

    def job_ids(self, states: str = "PD,R,CG,S,CF,RQ,RS,RH,SE,SO,ST,RD,RF") -> list[str]:
        """Ids of the jobs in the given squeue states (default: every state that is not
        final)."""
        out = self.run("squeue", "-h", "-t", states, "-o", "%i", timeout=10).stdout
        return out.split()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict (JobState, Reason, Restarts, ExitCode,
        StdOut, ...); empty once the record is gone (MinJobAge after the job ended).
        ``job_id`` may be an array task, ``ARRAYID_INDEX``."""
        res = self.run("scontrol", "show", "job", "-o", str(job_id), check=False, timeout=10)
        if res.returncode != 0:
            return {}
        # An array's own id lists every task, one line each: keep the first; ask for one
        # task as ARRAYID_INDEX. Values hold no spaces except a few free-text ones
        # (Command, Comment...); split on " Key=" boundaries so those come back whole.
        first = res.stdout.strip().split("\n")[0]
        fields = re.split(r" (?=[A-Za-z/:_]+=)", first)
        return dict(f.split("=", 1) for f in fields if "=" in f)

    def squeue_state(self, job_id: str) -> tuple[str, str] | None:
        """(state, reason) from ``squeue -t all``, e.g. ('PENDING', 'Resources'), or None
        when squeue no longer knows the job."""
        out = self.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T|%r",
                       check=False, timeout=10).stdout.strip()
        if not out:
            return None
        state, _, reason = out.splitlines()[0].partition("|")
        return state, reason

    def wait_job(self, job_id: str, states, timeout: float = 60,
                 restarts: int | None = None) -> dict:
        """Wait until ``scontrol show job`` reports one of ``states`` (and, if given, at least
        ``restarts`` restarts); returns the job's record. Raises with the record seen last
        and the daemons' logs on timeout."""
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        last = {}
        while time.monotonic() < deadline:
            last = self.job(job_id)
            if last.get("JobState") in states and (
                    restarts is None or int(last.get("Restarts", 0)) >= restarts):
                return last
            time.sleep(0.25)
        raise SlurmClusterError(
            f"job {job_id} not in {sorted(states)} after {timeout:.0f} s "
            f"(JobState={last.get('JobState')} Reason={last.get('Reason')} "
            f"Restarts={last.get('Restarts')})\n" + self.logs())

    # -- provoking failures ----------------------------------------------------------------

    def kill_slurmd(self) -> None:
        """SIGKILL slurmd, as a node crash would look to slurmctld (its steps live on until
        slurmd comes back and is told to kill them)."""
        proc = self.procs.get("slurmd")
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def start_slurmd(self, timeout: float = 60) -> None:
        """(Re)start slurmd and wait for the node to be idle again (ReturnToService=2
        returns a DOWN node to service when its slurmd registers)."""
        self.kill_slurmd()
        self._launch("slurmd", self._slurmd_argv())
        self._wait(lambda: self.node_state() == "idle", timeout, f"node {self.node} idle again")
