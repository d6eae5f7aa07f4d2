"""The private single-node Slurm cluster slurm_test.py runs its jobs on (munged, slurmctld and
slurmd on localhost, in a temporary directory), and what the test needs around it: an
environment without the outer Slurm, a free port, a log's tail, the processes left behind."""

import os
import pwd
import re
import signal
import socket
import subprocess
import time
from pathlib import Path


class Failure(Exception):
    pass


def log(msg):
    print(f"slurm test: {msg}", flush=True)


def slurm_free_env(extra=None):
    """This environment without any Slurm job's variables (the test may itself run in a job)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(extra or {})
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, lines=60):
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"({e})"
    return "\n".join(text[-lines:])


class Cluster:
    """munged, slurmctld and slurmd for one node on localhost, all inside `dir`."""

    def __init__(self, programs, dir):
        self.p = programs
        self.dir = dir
        self.conf = dir / "slurm.conf"
        self.socket = dir / "run" / "munge.socket"
        self.logs = dir / "log"
        self.daemons = []  # (name, Popen), in start order
        self.env = slurm_free_env({"SLURM_CONF": str(self.conf)})

    def run(self, *args, check=True, timeout=30):
        r = subprocess.run([self.p[args[0]], *args[1:]], env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise Failure(f"{' '.join(args)}: status {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def start(self):
        d = self.dir
        # munged checks its directories: the key's private, the socket's reachable by all.
        d.chmod(0o755)
        for sub, mode in (("munge", 0o700), ("run", 0o755), ("log", 0o700), ("state", 0o700),
                          ("spool", 0o755), ("tmp", 0o1777)):
            (d / sub).mkdir()
            (d / sub).chmod(mode)  # not the umask's
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.node = self.write_conf()
        # In the foreground munged logs to stderr: log/munged.stdout.
        self.spawn("munged", "--foreground", f"--socket={self.socket}", f"--key-file={key}",
                   f"--pid-file={d / 'run' / 'munged.pid'}",
                   f"--seed-file={d / 'munge' / 'munged.seed'}")
        self.wait(lambda: self.socket.exists(), 20, "munged's socket")
        self.spawn("slurmctld", "-D", "-f", str(self.conf))
        self.spawn("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        self.wait(self.node_idle, 60, f"node {self.node} idle")
        log(f"cluster up: node {self.node} idle ({self.node_line})")

    def write_conf(self):
        d = self.dir
        # This node as slurmd sees it: NodeName=<short host name> CPUs=... RealMemory=...
        line = subprocess.run([self.p["slurmd"], "-C"], capture_output=True, text=True,
                              env=self.env, timeout=30).stdout.splitlines()[0]
        node = re.match(r"NodeName=(\S+)", line)
        if not node:
            raise Failure(f"slurmd -C: unexpected output {line!r}")
        self.node_line = line.split(" ", 1)[1]
        user = pwd.getpwuid(os.getuid()).pw_name
        self.conf.write_text(f"""\
# A private single-node cluster for tests/slurm/slurm_test.py, on localhost.
ClusterName=cpdrifttest
SlurmctldHost={node[1]}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}
SlurmdPidFile={d / 'run' / 'slurmd.pid'}
SlurmctldLogFile={self.logs / 'slurmctld.log'}
SlurmdLogFile={self.logs / 'slurmd.log'}
# The jobs' scratch (srun's PMIx directories) inside the test's directory too.
TmpFS={d / 'tmp'}
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (a container may not delegate them): processes tracked by parentage, not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=5
{line} NodeAddr=127.0.0.1
PartitionName=test Nodes={node[1]} Default=YES MaxTime=INFINITE State=UP
""")
        return node[1]

    def spawn(self, name, *args):
        out = open(self.logs / f"{name}.stdout", "w")
        self.daemons.append((name, subprocess.Popen([self.p[name], *args], env=self.env,
                                                    stdout=out, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL)))
        out.close()

    def wait(self, ready, seconds, what):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, proc in self.daemons:
                if proc.poll() is not None:
                    raise Failure(f"{name} exited with status {proc.returncode} while waiting "
                                  f"for {what}")
            if ready():
                return
            time.sleep(0.5)
        raise Failure(f"no {what} after {seconds} s")

    def node_idle(self):
        r = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%t", check=False)
        return r.strip() == "idle"

    def job(self, job_id):
        """scontrol's fields of a job, as a dict."""
        text = self.run("scontrol", "-o", "show", "job", str(job_id))
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def print_logs(self):
        for name in ("slurmctld.log", "slurmd.log", "munged.stdout"):
            print(f"----- {name} (last lines)\n{tail(self.logs / name)}", flush=True)

    def stop(self):
        """Cancels every job, waits for their steps to go, then stops the daemons."""
        alive = {name: proc.poll() is None for name, proc in self.daemons}
        if alive.get("slurmctld"):
            try:
                jobs = self.run("squeue", "-h", "-o", "%i", check=False).split()
                if jobs:
                    self.run("scancel", *jobs, check=False)
                # slurmstepd outlives slurmd: wait until no job runs and no step's socket
                # (<node>_<job>.<step> in the spool directory) is left.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and (
                        self.run("squeue", "-h", "-o", "%i", check=False).strip()
                        or list((self.dir / "spool").glob(f"{self.node}_*"))):
                    time.sleep(0.5)
            except (subprocess.TimeoutExpired, OSError) as e:
                log(f"while cancelling jobs: {e}")
        for name, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.daemons = []
        # Anything left that came from this cluster (a job process, a step daemon) carries its
        # SLURM_CONF, the test directory's path, in its environment: end it and say so.
        left = stragglers(str(self.conf))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


def stragglers(marker):
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found
