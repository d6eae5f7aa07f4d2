#!/usr/bin/env python3
"""The digest matrix: every bit a fixed set of cpdrift runs produces, as one sorted listing.

A refactor or a faster kernel must not change a single bit (the developers' brief): run this
with the build before and the build after and compare the listings, or compare one build with
the summary checked in beside this script (`--check tests/digest_matrix.golden`, a meson test:
one line per case, the SHA-256 of its lines).

The matrix: TP 1,2 x CP 1,2,4 x split none,4 x contiguous,zigzag x ag_rs,ring_kv,allgather_kv
with the backward and dlogp legs (B=2, S=32, BF16, vocabulary 17); the same grid in FP32
without RoPE (no legs); the paged cases (paged prefill and decode, split-KV disabled, fixed and
auto, B=3); and TP 1,2 x CP 1,2 with dlogp at the default vocabulary.
Each line is `run case path value` for every digest and every drift statistic of the JSON
report (statistics are exact, so they are bits too). With --dump every dataset of the HDF5
dump is hashed as well (needs h5py).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

# distributed_p2p_reference repeats cp_merge_fp32's figures when the case ran on more than one
# process: left out, so the listing is the same for every process count.
LAUNCH_DEPENDENT = ("distributed_p2p_reference",)

STATS = ("max_abs", "mean_abs", "p95_abs", "p99_abs", "active_count", "bitwise_equal",
         "mismatch_count", "max_ulp", "nonfinite_count", "digest")

GRID = ["--tp-world-sizes", "1,2", "--cp-world-sizes", "1,2,4", "--kv-chunk-sizes", "none,4",
        "--cp-layouts", "contiguous,zigzag", "--protocols", "ag_rs,ring_kv,allgather_kv"]

# The runs pin the synthetic vocabulary at 17 (the default before 4096), so their lines keep
# the bits they always had; "vocab" takes the default.
RUNS = {
    "bf16_legs": GRID + ["--batch", "2", "--seq-len", "32", "--include-backward",
                         "--include-dlogp", "--vocab-size", "17"],
    "fp32_norope": GRID + ["--seq-len", "32", "--dtype", "fp32", "--no-rope"],
    "paged": ["--modes", "paged_prefill,decode", "--split-kv-policies", "disabled,fixed,auto",
              "--page-size", "4", "--fixed-split-size", "8", "--seq-len", "64", "--batch", "3",
              "--q-len", "5", "--vocab-size", "17"],
    "vocab": ["--tp-world-sizes", "1,2", "--cp-world-sizes", "1,2", "--kv-chunk-sizes", "4",
              "--batch", "2", "--seq-len", "32", "--include-dlogp"],
}


def leaves(value, path):
    """(path, value) for every statistic and digest below `value`."""
    if isinstance(value, dict):
        for key in sorted(value):
            child = value[key]
            if key in LAUNCH_DEPENDENT:
                continue
            if key in STATS and not isinstance(child, (dict, list)):
                yield f"{path}.{key}", child
            else:
                yield from leaves(child, f"{path}.{key}")
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from leaves(child, f"{path}[{i}]")


def report_lines(run, report):
    for section in ("cases", "paged_cases"):
        for case in report.get(section, []):
            name = case["case_name"]
            for path, value in leaves(case, ""):
                yield f"{run} {name} {path[1:]} {json.dumps(value)}"
    for key in ("merge_oracle", "dlogp"):
        for path, value in leaves(report.get(key, {}), key):
            yield f"{run} - {path} {json.dumps(value)}"


def dump_lines(run, path):
    import h5py  # noqa: PLC0415 (only --dump needs it)

    lines = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and name != "report_json":
            data = obj[()]
            raw = data.tobytes() if hasattr(data, "tobytes") else bytes(data)
            lines.append(f"{run} dump /{name} {hashlib.sha256(raw).hexdigest()}")

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return lines


def run_matrix(args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs:
            flags = RUNS[run]
            out = os.path.join(tmp, run + ".json")
            cmd = [args.cpdrift] + flags + args.extra + ["--quiet", "--output", out]
            if args.dump:
                cmd += ["--dump", os.path.join(tmp, run + ".h5")]
            if args.np > 1:
                cmd = [args.mpirun, "-np", str(args.np), "--oversubscribe"] + cmd
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"digest_matrix: {run} exited {done.returncode}:\n{done.stderr}",
                      file=sys.stderr)
                sys.exit(2)
            with open(out) as f:
                lines += report_lines(run, json.load(f))
            if args.dump:
                lines += dump_lines(run, os.path.join(tmp, run + ".h5"))
    return sorted(lines)


def summary(lines):
    """One line per (run, case): the SHA-256 of its lines, and how many there are."""
    cases = {}
    for line in lines:
        run, case, _ = line.split(" ", 2)
        cases.setdefault((run, case), []).append(line)
    return [f"{run} {case} {hashlib.sha256(chr(10).join(body).encode()).hexdigest()} {len(body)}"
            for (run, case), body in sorted(cases.items())]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpdrift", required=True, help="the cpdrift binary")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--np", type=int, default=4, help="processes (1: no mpirun)")
    p.add_argument("--dump", action="store_true", help="also hash the HDF5 dump (h5py)")
    p.add_argument("--output", help="write the listing here (default: stdout)")
    p.add_argument("--extra", action="append", default=[],
                   help="one more cpdrift argument for every run (the negative control's --seed)")
    p.add_argument("--summary", action="store_true",
                   help="one line per case (its lines' SHA-256): the form --check compares")
    p.add_argument("--check", metavar="GOLDEN", help="fail unless the summary equals GOLDEN")
    p.add_argument("--expect-differ", action="store_true",
                   help="with --check: the negative control; exit 0 only when every run ran and "
                        "the summary differs from GOLDEN (1 when it is equal, 2 when a run "
                        "failed)")
    p.add_argument("--runs", default=",".join(RUNS),
                   help="comma-separated runs of the matrix to make (default all: "
                        f"{','.join(RUNS)}); --check then compares those runs' lines only")
    args = p.parse_args()
    args.runs = args.runs.split(",")
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown:
        p.error(f"--runs: no run named {', '.join(unknown)}")
    lines = run_matrix(args)
    if args.summary or args.check:
        lines = summary(lines)
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    if args.check:
        with open(args.check) as f:
            golden = [line for line in f.read().splitlines()
                      if line.split(" ", 1)[0] in args.runs]
        if args.expect_differ:
            if golden == lines:
                print(f"digest matrix: equal to {args.check}, expected to differ", file=sys.stderr)
                sys.exit(1)
            print(f"digest matrix: differs from {args.check} in "
                  f"{len(set(golden) ^ set(lines))} lines, as expected")
            return
        if golden != lines:
            gone = sorted(set(golden) - set(lines))
            new = sorted(set(lines) - set(golden))
            print(f"digest matrix differs from {args.check} in these cases (compare the full "
                  "listings of the two builds, without --check, to see which figures):",
                  file=sys.stderr)
            for line in gone[:20]:
                print("- " + line, file=sys.stderr)
            for line in new[:20]:
                print("+ " + line, file=sys.stderr)
            sys.exit(1)
        print(f"digest matrix: {len(lines)} cases equal to {args.check}")
    elif not args.output:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
