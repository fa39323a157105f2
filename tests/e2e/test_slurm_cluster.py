"""The Slurm test cluster itself, against the real daemons (tests/slurm_cluster.py).

These pin down how Slurm 22.05 behaves on a one-node cluster, for the Slurm executor and its
tests: how each job state shows up, what a batch job sees, what requeue, scancel, a time
limit, a preemption and a dead node do. Without accounting ``sacct`` does not work, so
every state here is read from ``scontrol show job -o`` and ``squeue -t all`` (plain
``squeue`` hides finished jobs); both keep a finished job for MinJobAge (300 s).

They skip when Slurm/munge are not installed or not root (CI installs them: .ci/run).
"""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurm_cluster import MARK_CLUSTER, SlurmCluster, _marked_processes, unavailable_reason

# slow: the cluster takes seconds to start and its time-limit tests minutes; xdist_group:
# one worker runs every Slurm test, one at a time, on the session's one cluster
pytestmark = [pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
              pytest.mark.slow, pytest.mark.xdist_group("slurm")]

# A batch script that notes which signals its shell got (Slurm only signals the batch
# shell itself with --signal=B:..., on cancel, requeue, preemption and the time limit) and
# how many times it was started, then sleeps in short steps so traps run promptly.
TRAP_SCRIPT = textwrap.dedent("""\
    #!/bin/bash
    marks={marks}/$SLURM_JOB_ID.marks
    trap 'echo USR1 $(date +%s) >> $marks' USR1
    trap 'echo TERM $(date +%s) >> $marks; exit 143' TERM
    echo start restart=${{SLURM_RESTART_COUNT:-0}} $(date +%s) >> $marks
    for i in $(seq 1 {seconds}); do sleep 1; done
    echo end $(date +%s) >> $marks
""")


def trap_script(cluster, seconds=600):
    return TRAP_SCRIPT.format(marks=cluster.jobs_dir, seconds=seconds)


def marks(cluster, job_id) -> list[str]:
    """The lines the trap script wrote (first word of each: start/USR1/TERM/end)."""
    f = cluster.jobs_dir / f"{job_id}.marks"
    return f.read_text().splitlines() if f.exists() else []


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"waited {timeout} s for {what}")


@pytest.fixture
def cluster(slurm_cluster):
    """The session's cluster, left with no job running after each test (tests share it, and
    the preemption test needs the whole node)."""
    yield slurm_cluster
    slurm_cluster.cancel_all()


def test_node_is_idle_and_isolated(cluster):
    assert cluster.node_state() == "idle"
    out = cluster.run("sinfo", "-h", "-o", "%P %a %t %D").stdout.split("\n")
    assert "debug* up idle 1" in out and "urgent up idle 1" in out
    conf = cluster.conf_path.read_text()
    # Only this cluster's munged and ports: nothing of a system-wide install is used.
    assert f"AuthInfo=socket={cluster.munge_socket}," in conf
    assert "SlurmctldPort=6817\n" not in conf
    assert cluster.startup_s is not None and cluster.startup_s < 60


def test_batch_job_runs_and_writes_its_output(cluster):
    out = cluster.jobs_dir / "hello-%j.out"
    job = cluster.sbatch(f"--output={out}", "--job-name=hello",
                         "--wrap=echo hello; env | grep ^SLURM | sort")
    rec = cluster.wait_job(job, "COMPLETED", 30)
    assert rec["ExitCode"] == "0:0" and rec["Reason"] == "None"
    # scontrol shows the output path with %j filled in; the file is complete once COMPLETED.
    path = Path(rec["StdOut"])
    assert path == cluster.jobs_dir / f"hello-{job}.out"
    text = path.read_text()
    assert text.startswith("hello\n")
    env = dict(line.split("=", 1) for line in text.splitlines()[1:])
    assert env["SLURM_JOB_ID"] == job and env["SLURM_JOB_NAME"] == "hello"
    assert env["SLURM_CONF"] == str(cluster.conf_path)   # sbatch exports the submit env
    assert "SLURM_RESTART_COUNT" not in env              # only set from the first requeue on
    # Finished jobs stay visible to squeue only with -t all.
    assert cluster.squeue_state(job) == ("COMPLETED", "None")
    assert job not in cluster.run("squeue", "-h", "-o", "%i").stdout.split()


def test_failing_job_is_failed_with_its_exit_code(cluster):
    job = cluster.sbatch(f"--output={cluster.jobs_dir}/%j.out", "--wrap=exit 3")
    rec = cluster.wait_job(job, "FAILED", 30)
    assert rec["ExitCode"] == "3:0" and rec["Reason"] == "NonZeroExitCode"
    assert cluster.squeue_state(job) == ("FAILED", "NonZeroExitCode")


def test_pending_job_shows_its_reason(cluster):
    held = cluster.sbatch("--hold", f"--output={cluster.jobs_dir}/%j.out", "--wrap=true")
    later = cluster.sbatch("--begin=now+600", f"--output={cluster.jobs_dir}/%j.out", "--wrap=true")
    wait_for(lambda: cluster.squeue_state(later) == ("PENDING", "BeginTime"), 10, "BeginTime")
    assert cluster.squeue_state(held) == ("PENDING", "JobHeldUser")
    assert cluster.job(held)["Reason"] == "JobHeldUser"
    cluster.run("scontrol", "release", held)
    cluster.wait_job(held, "COMPLETED", 30)


def test_requeue_of_running_job_runs_it_again(cluster):
    # --open-mode=append keeps the first attempt's output; the default truncates it.
    job = cluster.sbatch("--requeue", "--open-mode=append",
                         f"--output={cluster.jobs_dir}/%j.out", script=trap_script(cluster))
    cluster.wait_job(job, "RUNNING", 30)
    wait_for(lambda: marks(cluster, job), 10, "the job to start")
    cluster.run("scontrol", "requeue", job)
    # Back to PENDING with Restarts=1; it may start again only after cred_expire (10 s
    # here, 120 s by default), so the reason reads BeginTime meanwhile.
    rec = cluster.wait_job(job, "PENDING", 15, restarts=1)
    assert rec["Reason"] in ("BeginTime", "None")
    rec = cluster.wait_job(job, "RUNNING", 40, restarts=1)
    wait_for(lambda: len(marks(cluster, job)) >= 3, 10, "the second start")
    lines = [m.split()[:2] for m in marks(cluster, job)]
    # The batch shell gets SIGTERM first (SIGKILL after KillWait): time to checkpoint; the
    # second start sees SLURM_RESTART_COUNT=1.
    assert [line[0] for line in lines] == ["start", "TERM", "start"]
    assert lines[0][1] == "restart=0" and lines[2][1] == "restart=1"
    assert "DUE TO JOB REQUEUE" in (cluster.jobs_dir / f"{job}.out").read_text()


def test_scancel_cancels_a_running_job_after_sigterm(cluster):
    job = cluster.sbatch(f"--output={cluster.jobs_dir}/%j.out", script=trap_script(cluster))
    cluster.wait_job(job, "RUNNING", 30)
    wait_for(lambda: marks(cluster, job), 10, "the job to start")
    cluster.run("scancel", job)
    rec = cluster.wait_job(job, "CANCELLED", 20)
    assert cluster.squeue_state(job)[0] == "CANCELLED"
    # ExitCode is "status:signal": the trap exits 143 (a shell killed by TERM: "0:15").
    assert rec["ExitCode"] == "143:0" and rec["Reason"] == "None"
    # The batch shell gets SIGTERM (then SIGKILL after KillWait): time to checkpoint.
    assert [m.split()[0] for m in marks(cluster, job)] == ["start", "TERM"]


def test_scancel_of_pending_job(cluster):
    job = cluster.sbatch("--hold", f"--output={cluster.jobs_dir}/%j.out", "--wrap=true")
    cluster.run("scancel", job)
    cluster.wait_job(job, "CANCELLED", 10)


def test_array_tasks_see_their_index(cluster):
    array = cluster.sbatch("--array=0-1", f"--output={cluster.jobs_dir}/arr-%A_%a.out",
                           "--wrap=echo $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_JOB_ID")
    # squeue names tasks ARRAYID_INDEX; each task also has its own plain job id.
    def done():
        out = cluster.run("squeue", "-h", "-t", "all", "-j", array, "-o", "%i %T").stdout
        return sorted(out.split("\n")[:-1]) == [f"{array}_0 COMPLETED", f"{array}_1 COMPLETED"]
    wait_for(done, 30, "both array tasks to complete")
    for index in (0, 1):
        array_id, task, job_id = (cluster.jobs_dir / f"arr-{array}_{index}.out").read_text().split()
        assert (array_id, task) == (array, str(index))
        # A task is ARRAYID_INDEX to scontrol; the array's own id would list all tasks
        # (and is also the plain job id of one of them, usually the last to start).
        rec = cluster.job(f"{array}_{index}")
        assert (rec["JobId"], rec["ArrayJobId"], rec["ArrayTaskId"]) == (job_id, array, str(index))


def test_preemption_by_the_urgent_partition(cluster):
    """A job in ``urgent`` takes the node from a ``debug`` job: a requeueable job gets SIGTERM,
    goes back to PENDING (Restarts=1, nothing in its record says "preempted") and runs
    again later; a --no-requeue job ends as PREEMPTED."""
    whole = f"--cpus-per-task={cluster.node_cpus}"
    low = cluster.sbatch(whole, "--requeue", "--open-mode=append",
                         f"--output={cluster.jobs_dir}/%j.out", script=trap_script(cluster))
    cluster.wait_job(low, "RUNNING", 30)
    wait_for(lambda: marks(cluster, low), 10, "the job to start")
    high = cluster.sbatch("--partition=urgent", whole, f"--output={cluster.jobs_dir}/%j.out",
                          "--wrap=sleep 1")
    cluster.wait_job(low, "PENDING", 15, restarts=1)
    cluster.wait_job(high, "COMPLETED", 30)
    cluster.wait_job(low, "RUNNING", 40, restarts=1)
    wait_for(lambda: len(marks(cluster, low)) >= 3, 10, "the second start")
    assert [m.split()[:2][0] for m in marks(cluster, low)] == ["start", "TERM", "start"]
    assert "DUE TO PREEMPTION" in (cluster.jobs_dir / f"{low}.out").read_text()
    cluster.run("scancel", low)
    cluster.wait_job(low, "CANCELLED", 20)

    once = cluster.sbatch(whole, "--no-requeue", f"--output={cluster.jobs_dir}/%j.out",
                          script=trap_script(cluster))
    cluster.wait_job(once, "RUNNING", 30)
    cluster.sbatch("--partition=urgent", whole, f"--output={cluster.jobs_dir}/%j.out",
                   "--wrap=true")
    cluster.wait_job(once, "PREEMPTED", 20)
    assert cluster.squeue_state(once)[0] == "PREEMPTED"


@pytest.fixture(scope="module")
def time_limited_job(slurm_cluster):
    """One job with a 1-minute limit and USR1 asked for 40 s before it, shared by the two
    time-limit tests (Slurm counts limits in minutes and checks them about every 30 s, so
    each costs 60-90 s)."""
    job = slurm_cluster.sbatch("--time=0:01", "--signal=B:USR1@40",
                               f"--output={slurm_cluster.jobs_dir}/%j.out",
                               script=trap_script(slurm_cluster))
    slurm_cluster.wait_job(job, "RUNNING", 30)
    return job


@pytest.mark.slow
def test_signal_before_the_time_limit(slurm_cluster, time_limited_job):
    job, cluster = time_limited_job, slurm_cluster
    wait_for(lambda: any(m.startswith("USR1") for m in marks(cluster, job)), 75,
             "USR1 before the time limit")
    assert cluster.job(job)["JobState"] == "RUNNING"   # the shell trapped it and goes on
    start = int(marks(cluster, job)[0].split()[2])
    usr1 = int(next(m for m in marks(cluster, job) if m.startswith("USR1")).split()[1])
    # Asked for 40 s before the limit, i.e. 20 s in; Slurm checks about every 30 s and may
    # send it up to a minute early: seen 16 s and 26 s in.
    assert 0 <= usr1 - start < 60


@pytest.mark.slow
def test_time_limit_ends_as_timeout(slurm_cluster, time_limited_job):
    job, cluster = time_limited_job, slurm_cluster
    rec = cluster.wait_job(job, "TIMEOUT", 120)
    assert rec["Reason"] == "TimeLimit" and rec["TimeLimit"] == "00:01:00"
    assert cluster.squeue_state(job) == ("TIMEOUT", "TimeLimit")
    # At the limit the shell gets SIGTERM, then SIGKILL after KillWait (5 s).
    kinds = [m.split()[0] for m in marks(cluster, job)]
    assert kinds[0] == "start" and "USR1" in kinds and kinds[-1] == "TERM"
    assert "DUE TO TIME LIMIT" in (cluster.jobs_dir / f"{job}.out").read_text()


@pytest.mark.slow
def test_dead_slurmd_is_node_fail(cluster):
    """SIGKILL slurmd: after SlurmdTimeout (10 s) plus a ping round the node is DOWN, a
    --no-requeue job ends NODE_FAIL and a requeueable one goes back to PENDING; a new
    slurmd brings the node back (ReturnToService=2) and the old steps are killed."""
    once = cluster.sbatch("--no-requeue", f"--output={cluster.jobs_dir}/%j.out",
                          script=trap_script(cluster))
    again = cluster.sbatch("--requeue", f"--output={cluster.jobs_dir}/%j.out",
                           script=trap_script(cluster))
    cluster.wait_job(once, "RUNNING", 30)
    cluster.wait_job(again, "RUNNING", 30)
    try:
        cluster.kill_slurmd()
        rec = cluster.wait_job(once, "NODE_FAIL", 60)
        assert rec["Reason"] == "NodeDown"
        assert cluster.node_state().startswith("down")
        assert cluster.job(again)["JobState"] == "PENDING"
        assert cluster.job(again)["Restarts"] == "1"
    finally:
        cluster.start_slurmd()
    cluster.wait_job(again, "RUNNING", 40, restarts=1)


def test_a_second_cluster_runs_beside_and_leaves_nothing(cluster, tmp_path):
    """Two clusters at once (other ports, other munged), one whose node claims more CPUs
    than the machine has (cpus=: more 1-CPU jobs side by side); stop() kills every
    daemon, step and job of its own, and removes munge's socket folder."""
    cpus = (os.cpu_count() or 1) + 2
    with SlurmCluster(tmp_path / "second", cpus=cpus) as other:
        assert other.ctld_port != cluster.ctld_port
        jobs = [other.sbatch(f"--output={other.jobs_dir}/%j.out", "--wrap=sleep 300")
                for _ in range(cpus)]
        for job in jobs:
            other.wait_job(job, "RUNNING", 30)
        mine = [p for p, env in _marked_processes().items()
                if env.get(MARK_CLUSTER) == str(other.base)]
        assert len(mine) >= 5   # munged, slurmctld (+ slurmscriptd), slurmd, slurmstepd, job
        sock_dir = other.sock_dir
    assert not [p for p, env in _marked_processes().items()
                if env.get(MARK_CLUSTER) == str(other.base) and not _zombie(p)]
    assert not sock_dir.exists()
    assert cluster.node_state() == "idle"


def test_orphans_of_a_killed_session_are_cleaned_up(cluster, tmp_path):
    """A test session killed with SIGKILL never stops its cluster; the next start kills
    what the dead owner left (here: a cluster started by a child Python we kill)."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from slurm_cluster import SlurmCluster
        c = SlurmCluster({str(tmp_path / 'orphan')!r}).start()
        print(c.base, flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        base = child.stdout.readline().strip()
        assert base, "the child could not start its cluster"
        assert [p for p, env in _marked_processes().items() if env.get(MARK_CLUSTER) == base]
    finally:
        child.kill()
        child.wait()
    from slurm_cluster import kill_orphaned_clusters
    killed = kill_orphaned_clusters()
    assert killed
    wait_for(lambda: not [p for p, env in _marked_processes().items()
                          if env.get(MARK_CLUSTER) == base and not _zombie(p)], 10,
             "the orphans to die")
    # The session's own cluster (a live owner) is untouched.
    assert cluster.node_state() == "idle"


def _zombie(pid: int) -> bool:
    """A process that has exited but not been reaped yet (its parent may be pid 1, which
    reaps on its own time here) holds nothing and does not count as a leftover."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
