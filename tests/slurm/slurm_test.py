#!/usr/bin/env python3
"""The job scripts of jobs/ under a real Slurm (docs/slurm.md).

First, outside Slurm, every jobs/*.sbatch must refuse: status 2 and one line naming
SLURM_JOB_ID. Then a private single-node cluster on localhost, in a temporary directory:
munged with its own key and socket, slurmctld and slurmd from a generated slurm.conf (this
host's name, CPUs and memory as `slurmd -C` reads them, free ports, every state, spool, pid and
log file inside the directory). Once the node is idle, the CPU variant of
jobs/cpdrift-tp2cp2.sbatch is submitted twice, through `srun --mpi=pmix` and through `mpirun`,
at a size of seconds; each job must complete with status 0, its Slurm output must hold
`# Drift check : OK`, and its report, named by the job id, must have passed with the grid's
case count, topology, process count and launcher. The gate, jobs/cpdrift-accept.sbatch, must
write its acceptance document under the job id, with no row failed and the job's exit code its
verdict's (Slurm must not kill the processes still exiting: the status stays 1). A third run
of the drift script, whose process 1 exits in the middle of the exchange (--inject-fault
rank-exit@1), must fail, leave no report and end within srun's --wait bound. Every process the
test started -- jobs, job steps and daemons -- is stopped on the
way out, whatever happened.

Exit status 0 passed, 1 failed, 77 (Meson's skip) when a Slurm or munge program is missing or
the test is not root (slurmd must be, to start jobs).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_cluster import Cluster, Failure, log, slurm_free_env, tail

SKIP = 77
# Each program the test runs, and the Debian package that installs it.
PROGRAMS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "srun": "slurm-client",
}
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
# The jobs' problem: TP=2 x CP=2 on 4 tasks, S=64, split-KV off and 16, the script's layouts
# (contiguous, zigzag) and protocols (ag_rs, ring_kv): 8 cases.
SEQ_LEN, KV_CHUNKS, CASES, TASKS = 64, "none,16", 8, 4
# A job whose process dies ends within srun's --wait (60 s, jobs/lib/cpdrift-job.sh) after it,
# plus the start-up before the exchange (seconds; under ASan, tens of seconds).
FAULT_BOUND_S = 150


def check_guards(root):
    """Every job script, run outside Slurm, refuses with status 2 and one line."""
    scripts = sorted((root / "jobs").glob("*.sbatch"))
    if not scripts:
        raise Failure("no jobs/*.sbatch")
    for script in scripts:
        r = subprocess.run(["bash", str(script)], env=slurm_free_env(), cwd=root,
                           capture_output=True, text=True, timeout=30)
        lines = r.stderr.splitlines()
        if r.returncode != 2 or len(lines) != 1 or "SLURM_JOB_ID" not in lines[0] or r.stdout:
            raise Failure(f"{script.name} outside Slurm: status {r.returncode}, stdout "
                          f"{r.stdout!r}, stderr {r.stderr!r} (expected status 2 and one line "
                          "naming SLURM_JOB_ID)")
    log(f"outside Slurm, {len(scripts)} job scripts refuse: {lines[0]}")


def find_programs():
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    found = {}
    for name, package in PROGRAMS.items():
        found[name] = shutil.which(name, path=path)
        if found[name] is None:
            print(f"slurm test: skipped: {name} not found (Debian package {package})")
            sys.exit(SKIP)
    return found


def submit(cluster, root, cpdrift, script, launcher, rundir, extra_env):
    """Submits the CPU variant of `script` from the checkout; its outputs go to `rundir`."""
    rundir.mkdir()
    env = dict(cluster.env, CPDRIFT_BIN=str(cpdrift), CPDRIFT_DEVICE="cpu",
               CPDRIFT_LAUNCHER=launcher, CPDRIFT_SEQ_LEN=str(SEQ_LEN),
               CPDRIFT_KV_CHUNK_SIZES=KV_CHUNKS,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TMPDIR=str(cluster.dir / "tmp"), **extra_env)  # Open MPI's session directories
    env.pop("CPDRIFT_ROOT", None)  # found as the submit directory, as documented
    env.pop("CPDRIFT_OUTDIR", None)
    # The CPU variant: no GPUs, and 4 tasks on however few CPUs this machine has.
    cmd = [cluster.p["sbatch"], "--parsable", f"--chdir={rundir}", "--overcommit",
           "--cpus-per-task=1", "--gpus-per-node=0", str(root / "jobs" / script)]
    r = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise Failure(f"{' '.join(cmd)}: status {r.returncode}: {r.stderr.strip()}")
    job_id = int(r.stdout.strip().split(";")[0])
    log(f"submitted {script} ({launcher}) as job {job_id}: {' '.join(cmd[1:])}")
    return job_id


def wait_job(cluster, job_id, deadline):
    while True:
        fields = cluster.job(job_id)
        if fields.get("JobState") in FINAL_STATES:
            return fields
        if time.monotonic() > deadline:
            raise Failure(f"job {job_id} still {fields.get('JobState')} "
                          f"({fields.get('Reason')}) at the time limit")
        time.sleep(1)


def job_files(job_id, rundir, name):
    """The job's Slurm output, <name>-<id>.out, alone in `rundir`: (problems, its text)."""
    outs = sorted(p.name for p in rundir.glob("*.out"))
    problems = []
    if outs != [f"{name}-{job_id}.out"]:
        problems.append(f"Slurm output files {outs}, expected {name}-{job_id}.out")
        return problems, ""
    return problems, (rundir / outs[0]).read_text(errors="replace")


def check_run(job_id, fields, rundir, launcher, dump):
    """A drift run: completed, '# Drift check : OK', the report named by the job id."""
    name = "cpdrift-tp2cp2"
    problems, out = job_files(job_id, rundir, name)
    if fields.get("JobState") != "COMPLETED" or fields.get("ExitCode") != "0:0":
        problems.append(f"state {fields.get('JobState')}, exit code {fields.get('ExitCode')}")
    if out and "# Drift check : OK" not in out.splitlines():
        problems.append("no '# Drift check : OK' line in the Slurm output")
    reports = sorted(p.name for p in rundir.glob("*.json"))
    if reports != [f"{name}-{job_id}.json"]:
        problems.append(f"reports {reports}, expected {name}-{job_id}.json")
    else:
        r = json.loads((rundir / reports[0]).read_text())
        cases = r.get("cases", [])
        topologies = {(c["topology"]["tp_world_size"], c["topology"]["cp_world_size"])
                      for c in cases}
        expect = {
            "summary.passed": (r["summary"]["passed"], True),
            "summary.case_count": (r["summary"]["case_count"], CASES),
            "len(cases)": (len(cases), CASES),
            "case topologies (tp, cp)": (topologies, {(2, 2)}),
            "target.seq_len": (r["target"]["seq_len"], SEQ_LEN),
            "launch.world_size": (r["launch"]["world_size"], TASKS),
            "launch.launcher": (r["launch"]["launcher"], launcher),
            "runtime.rank_env.SLURM_JOB_ID": (r["runtime"]["rank_env"].get("SLURM_JOB_ID"),
                                              str(job_id)),
            "runtime.device": (r["runtime"]["device"], "cpu"),
        }
        problems += [f"report {what} = {got!r}, expected {want!r}"
                     for what, (got, want) in expect.items() if got != want]
    if dump:
        h5 = rundir / f"{name}-{job_id}.h5"
        if not h5.is_file() or h5.read_bytes()[:8] != b"\x89HDF\r\n\x1a\n":
            problems.append(f"no HDF5 dump {h5.name}")
    report_problems(job_id, fields, launcher, out, problems)
    log(f"job {job_id} ({launcher}): COMPLETED 0:0, '# Drift check : OK', report "
        f"{reports[0]}: passed, {CASES} cases TP=2 CP=2, {TASKS} processes, launcher "
        f"{launcher}" + (f", dump {name}-{job_id}.h5" if dump else ""))


def check_accept(job_id, fields, rundir, launcher):
    """The acceptance gate: acceptance.json and report.json in cpdrift-accept-<id>/; the job's
    exit code is the verdict's. On a node without GPUs the rows that need GPU transports are
    unavailable, so the gate fails (exit 1) -- but no row may fail."""
    name = "cpdrift-accept"
    problems, out = job_files(job_id, rundir, name)
    gate = rundir / f"{name}-{job_id}"
    doc = gate / "acceptance.json"
    if not doc.is_file() or not (gate / "report.json").is_file():
        problems.append(f"no {doc.relative_to(rundir)} and report.json beside it")
    else:
        d = json.loads(doc.read_text())
        verdict = "PASSED" if d["passed"] else "FAILED"
        want_exit = "0:0" if d["passed"] else "1:0"
        if fields.get("ExitCode") != want_exit:
            problems.append(f"exit code {fields.get('ExitCode')}, expected {want_exit} "
                            f"(acceptance passed: {d['passed']})")
        if out and f"# Acceptance : {verdict}" not in out.splitlines():
            problems.append(f"no '# Acceptance : {verdict}' line in the Slurm output")
        failed = [c["name"] for c in d["cases"] if c["status"] not in ("passed", "unavailable")]
        if failed or not d["cases"]:
            problems.append(f"rows neither passed nor unavailable: {failed}")
        if d["runtime"]["launch"]["world_size"] != TASKS:
            problems.append(f"world size {d['runtime']['launch']['world_size']}")
        statuses = sorted({c["status"] for c in d["cases"]})
    report_problems(job_id, fields, launcher, out, problems)
    log(f"job {job_id} ({launcher}): {fields['JobState']} {fields['ExitCode']}, "
        f"'# Acceptance : {verdict}', {doc.relative_to(rundir)}: {len(d['cases'])} rows "
        f"({', '.join(statuses)}), none failed")


def check_fault(job_id, fields, rundir, launcher):
    """A process that dies mid-exchange (--inject-fault rank-exit@1): the step ends (srun's
    --wait bounds how long the others outlive it), the job fails, and no report is written."""
    name = "cpdrift-tp2cp2"
    problems, out = job_files(job_id, rundir, name)
    if fields.get("JobState") != "FAILED" or fields.get("ExitCode") == "0:0":
        problems.append(f"state {fields.get('JobState')}, exit code {fields.get('ExitCode')}, "
                        "expected a failed job")
    reports = sorted(p.name for p in rundir.glob("*.json"))
    if reports:
        problems.append(f"reports {reports} written by a job whose process died")
    h, m, sec = (int(x) for x in fields.get("RunTime", "99:00:00").split(":"))
    if h * 3600 + m * 60 + sec > FAULT_BOUND_S:
        problems.append(f"RunTime {fields.get('RunTime')}: more than {FAULT_BOUND_S} s for a "
                        "step whose process died (srun --wait=60)")
    report_problems(job_id, fields, launcher, out, problems)
    log(f"job {job_id} ({launcher}, rank-exit@1): {fields['JobState']} {fields['ExitCode']} "
        f"after RunTime {fields['RunTime']}, no report")


def report_problems(job_id, fields, launcher, out, problems):
    if problems:
        print(f"----- job {job_id}: {' '.join(f'{k}={v}' for k, v in fields.items())}")
        print(f"----- its Slurm output\n{out}", flush=True)
        raise Failure(f"job {job_id} ({launcher}): " + "; ".join(problems))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-root", type=Path, required=True)
    ap.add_argument("--cpdrift", type=Path, required=True)
    ap.add_argument("--job-timeout", type=float, default=300,
                    help="seconds the jobs may take together, queueing included")
    ap.add_argument("--no-dump", action="store_true", help="cpdrift was built without HDF5")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    root, cpdrift = a.source_root.resolve(), a.cpdrift.resolve()

    # meson ends a test that overruns with SIGTERM: clean up as for any other failure.
    def terminated(signum, frame):
        raise Failure(f"signal {signum}")
    signal.signal(signal.SIGTERM, terminated)

    try:
        check_guards(root)
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    programs = find_programs()
    if os.geteuid() != 0:
        print("slurm test: skipped: slurmd must run as root to start jobs")
        return SKIP

    # A short path: unix sockets (munge, slurmstepd) must fit in 108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="cpdrift-slurm-", dir="/tmp"))
    cluster = Cluster(programs, tmp)
    status = 1
    try:
        cluster.start()
        # (script, launcher, the check, the environment it adds)
        runs = [
            ("cpdrift-tp2cp2.sbatch", "srun", "run", {} if a.no_dump else {"CPDRIFT_DUMP": "1"}),
            ("cpdrift-tp2cp2.sbatch", "mpirun", "run", {}),
            ("cpdrift-accept.sbatch", "srun", "accept", {}),
            ("cpdrift-tp2cp2.sbatch", "srun", "fault",
             {"CPDRIFT_EXTRA_ARGS": "--inject-fault rank-exit@1"}),
        ]
        jobs = []
        for i, (script, launcher, kind, env) in enumerate(runs):
            rundir = tmp / f"job{i}-{kind}-{launcher}"
            jobs.append((submit(cluster, root, cpdrift, script, launcher, rundir, env),
                         rundir, launcher, kind, "CPDRIFT_DUMP" in env))
        deadline = time.monotonic() + a.job_timeout
        start = time.monotonic()
        for job_id, rundir, launcher, kind, dump in jobs:
            fields = wait_job(cluster, job_id, deadline)
            log(f"job {job_id} ended {fields['JobState']} {fields.get('ExitCode')} after "
                f"{time.monotonic() - start:.0f} s (RunTime {fields.get('RunTime')})")
            if kind == "run":
                check_run(job_id, fields, rundir, launcher, dump)
            elif kind == "fault":
                check_fault(job_id, fields, rundir, launcher)
            else:
                check_accept(job_id, fields, rundir, launcher)
        status = 0
    except Exception as e:  # a Failure, or a report without a field the checks read
        log(f"FAILED: {e}" if isinstance(e, Failure) else f"FAILED: {type(e).__name__}: {e}")
        for out in sorted(tmp.glob("job*/*.out")):
            print(f"----- {out.relative_to(tmp)}\n{tail(out, 80)}", flush=True)
        cluster.print_logs()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup is not to be cut short
        left = cluster.stop()
        if left:
            log(f"FAILED: processes of the test's cluster were left running and killed: {left}")
            status = 1
        else:
            log("every job and daemon stopped")
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log("passed" if status == 0 else "failed")
    return status


if __name__ == "__main__":
    sys.exit(main())
