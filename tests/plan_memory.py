#!/usr/bin/env python3
"""`cpdrift plan`'s peak memory per process against the peak a run of the same command measures.

Plans the command (`cpdrift plan ... --json`, whose cases carry each process's planned peak),
runs it under mpirun (`--output`, whose summary.peak_rss_bytes_per_process is each process's
resident peak, getrusage's ru_maxrss), and prints both per process. Exits 1 when a process's
planned peak is off by more than --tolerance of its measured one, 2 when something failed to run.

--plan-extra adds options to the plan only: the negative control plans another problem, which
must then fail the comparison.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cpdrift", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--plan-extra", action="append", default=[])
    ap.add_argument("--expect-over", action="store_true",
                    help="the negative control: exit 0 only when both ran and some process is "
                         "off by more than --tolerance (1 when none is, 2 when something failed)")
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then the run's options")
    a = ap.parse_args()
    run_args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    plan = subprocess.run([a.cpdrift, "plan", *run_args, *a.plan_extra, "--device", "cpu",
                           "--json", "--quiet"], capture_output=True, text=True, env=env)
    if plan.returncode != 0:
        print(plan.stderr, file=sys.stderr)
        return 2
    cases = json.loads(plan.stdout)["cases"]
    planned = [max(c["memory"][p]["peak_bytes"] for c in cases)
               for p in range(len(cases[0]["memory"]))]
    phase = [max(((c["memory"][p]["peak_bytes"], c["memory"][p]["peak_phase"]) for c in cases))[1]
             for p in range(len(planned))]

    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        run = subprocess.run([a.mpirun, "-np", str(a.np), "--oversubscribe", a.cpdrift, *run_args,
                              "--quiet", "--output", report], capture_output=True, text=True,
                             env=env)
        if run.returncode not in (0, 1):
            print(run.stdout, run.stderr, file=sys.stderr)
            return 2
        with open(report) as f:
            measured = json.load(f)["summary"]["peak_rss_bytes_per_process"]
    if len(measured) != a.np or len(planned) != a.np:
        print(f"plan_memory: {len(planned)} planned and {len(measured)} measured processes, "
              f"expected {a.np}", file=sys.stderr)
        return 2

    worst = 0.0
    print(f"{'process':>7} {'planned MB':>11} {'measured MB':>12} {'error':>7}  planned peak phase")
    for p, (want, got) in enumerate(zip(planned, measured)):
        err = (want - got) / got
        worst = max(worst, abs(err))
        print(f"{p:>7} {want / 1e6:>11.1f} {got / 1e6:>12.1f} {err:>+7.1%}  {phase[p]}")
    ok = worst <= a.tolerance
    if a.expect_over:
        print(f"plan_memory: worst error {worst:.1%} (tolerance {a.tolerance:.0%}): "
              f"{'over, as expected' if not ok else 'within: the control did not fail'}")
        return 0 if not ok else 1
    print(f"plan_memory: worst error {worst:.1%} (tolerance {a.tolerance:.0%}): "
          f"{'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
