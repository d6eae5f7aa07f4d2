#!/usr/bin/env python3
"""The whole attention layer (--scope layer) bitwise across TP, CP, layouts, protocols and
process counts, with its controls.

Each model runs at S = 64, chunked prefill at a 4-token split (a KV block grid every CP shares),
over every TP that divides its heads, CP 1/2/4, both layouts and, for Qwen3-8B, the three
protocols and the logprobs through the layer's output (its lm_head sharded by vocabulary), on 1,
2 and 4 processes. Every case's layer output, and logprobs, must have the same digest, on every
process count (the run's own check refuses a case of a grid whose bits differ; the test
reads the digests too). The controls show the comparison can fail: o_proj's rank_sums order
(each TP rank's groups summed apart, then the ranks' sums added) gives other bits at TP 2 than
at TP 1 and the run says so; and a grid that differs (prefill without a split, CP 1 vs CP 2)
gives other bits. The rollout side: trainer TP=2 x CP=2 zigzag against the paged decode at rollout
TP 1, 2 and 4, bitwise in the layer's output and logprobs where the KV blocks align, drifting
where they do not. The backward (--include-backward): Qwen3-8B at every TP, CP 1/2/4, both
layouts on 4 processes (CP 1 and 4, zigzag, on 1), every other model at its least and largest
TP, CP 1 and 4, zigzag, on 4 (--full-backward, suite long: every model's whole matrix on 1, 2
and 4 processes); dX and every weight's gradient one digest each; rank_sums makes TP change dX and CP the weight
gradients. What the layer does not run yet is refused in
one line.

Usage: layer_matrix.py --cpdrift BIN --mpirun MPIRUN [--models a,b] [--full-backward]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from model_fixtures import finish, refusal_failure

# name: (Hq, Hkv)
MODELS = {
    "qwen3-8b": (32, 8), "qwen3-4b": (32, 8), "qwen3-14b": (40, 8), "qwen3-32b": (64, 8),
    "qwen3-30b-a3b": (32, 4), "llama-3.1-8b": (32, 8), "qwen2.5-7b": (28, 4),
}
BASE = ["--scope", "layer", "--seq-len", "64", "--modes", "chunked_prefill",
        "--kv-chunk-sizes", "4"]


def tp_sizes(hq, hkv):
    return [t for t in (1, 2, 4, 8) if hq % t == 0 and hkv % t == 0]


def run(args, np, flags, out):
    cmd = [args.mpirun, "-np", str(np), "--oversubscribe", args.cpdrift, *flags,
           "--output", out, "--quiet"]
    return subprocess.run(cmd, capture_output=True, text=True)


def load(path):
    with open(path) as f:
        return json.load(f)


def layer_digests(path):
    return {c["case_name"]: c["layer"]["out"]["digest"] for c in load(path)["cases"]}


def gradient_digests(path):
    """Per gradient of the layer's backward, its digest in each case."""
    out = {}
    for c in load(path)["cases"]:
        for name, s in c["layer"]["backward"].get("gradients", {}).items():
            out.setdefault(name, {})[c["case_name"]] = s["digest"]
    return out


def dlogp_digests(path):
    return {c["case_name"]: c["dlogp"]["drift"]["digest"] for c in load(path)["cases"]}


def check_model(args, work, name, hq, hkv, backward):
    """The forward (and the logprobs, for Qwen3-8B over the three protocols) on 1, 2 and 4
    processes; or, with `backward`, the layer's gradients: Qwen3-8B's at every TP, CP 1/2/4 and
    both layouts on 4 processes and at every TP, CP 1 and 4, zigzag on 1; every other model's at
    its least and largest TP, CP 1 and 4, zigzag, on 4 (each case computes and digests every
    weight's gradient, a second or so at S = 64: the whole matrix on every model would double
    the suite's time). The backward moves its data
    ag_rs-style whatever the forward's protocol, whose output the forward matrix shows the same."""
    failures = []
    tps = tp_sizes(hq, hkv)

    def flags_for(np):
        full = not backward or args.full_backward or (name == "qwen3-8b" and np == 4)
        sizes = tps if full or name == "qwen3-8b" else [tps[0], tps[-1]]
        f = [*BASE, "--model", name, "--tp-world-sizes", ",".join(map(str, sizes)),
             "--cp-world-sizes", "1,2,4" if full else "1,4",
             "--cp-layouts", "contiguous,zigzag" if full else "zigzag"]
        if backward:
            f += ["--include-backward"]
        elif name == "qwen3-8b":
            f += ["--protocols", "ag_rs,ring_kv,allgather_kv", "--include-dlogp"]
        return f

    seen, logprobs, gradients = set(), set(), {}
    nps = (1, 4) if name == "qwen3-8b" else (4,)
    for np in nps if backward and not args.full_backward else (1, 2, 4):
        out = os.path.join(work, f"{name}_np{np}{'_bwd' if backward else ''}.json")
        flags = flags_for(np)
        r = run(args, np, flags, out)
        if r.returncode != 0:
            failures.append(f"{name} np={np}: exit {r.returncode}: {r.stderr[-2000:]}")
            continue
        digests = layer_digests(out)
        seen |= set(digests.values())
        print(f"{name} np={np}: {len(digests)} cases, layer digests {sorted(set(digests.values()))}")
        for grad, by_case in gradient_digests(out).items():
            gradients.setdefault(grad, set()).update(by_case.values())
        if backward:
            print(f"{name} np={np}: digests per gradient: "
                  f"{ {g: len(d) for g, d in sorted(gradients.items())} }")
        if "--include-dlogp" in flags:
            logprobs |= set(dlogp_digests(out).values())
            print(f"{name} np={np}: logprob digests {sorted(logprobs)}")
    if len(seen) != 1:
        failures.append(f"{name}: the layer's output has {len(seen)} digests over the matrix "
                        f"and process counts, not one")
    expected = {"dx", "q_proj", "k_proj", "v_proj", "o_proj"} if backward else set()
    if not expected <= set(gradients):
        failures.append(f"{name}: the backward reported {sorted(gradients)}, not {sorted(expected)}")
    for grad, digests in sorted(gradients.items()):
        if len(digests) != 1:
            failures.append(f"{name}: the layer's {grad} has {len(digests)} digests over the "
                            f"matrix and process counts, not one")
    if "--include-dlogp" in flags and len(logprobs) != 1:
        failures.append(f"{name}: the logprobs have {len(logprobs)} digests, not one")
    return failures


def check_controls(args, work):
    failures = []
    out = os.path.join(work, "control.json")
    # Each rank's part summed apart, then the ranks' sums: o_proj's and dX's over the TP ranks,
    # the weight gradients' over the CP ranks. TP and CP change bits, and the run says so.
    r = run(args, 2, [*BASE, "--o-proj-order", "rank_sums", "--tp-world-sizes", "1,2",
                      "--cp-world-sizes", "1,2", "--include-backward"], out)
    failed = load(out)["summary"]["failed_checks"] if os.path.exists(out) else []
    digests = layer_digests(out) if os.path.exists(out) else {}
    print(f"control rank_sums: exit {r.returncode}, out digests {sorted(set(digests.values()))}")
    for f in failed:
        print(f"  {f}")
    if r.returncode != 1 or len(set(digests.values())) != 2:
        failures.append("control rank_sums: expected exit 1 and two output digests")
    for what in ["layer.out", "layer.backward.dx", "layer.backward.q_proj",
                 "layer.backward.o_proj", "layer.backward.v_proj"]:
        if not any(f"{what} bits differ" in f for f in failed):
            failures.append(f"control rank_sums: the run did not report {what} bits differing")
    # Another block grid: prefill without a split at CP 1 and 2 (the grid follows CP).
    out = os.path.join(work, "grid.json")
    r = run(args, 2, ["--scope", "layer", "--seq-len", "64", "--modes", "prefill",
                      "--tp-world-sizes", "1", "--cp-world-sizes", "1,2"], out)
    digests = layer_digests(out) if r.returncode == 0 else {}
    print(f"control grid: exit {r.returncode}, digests {sorted(set(digests.values()))}")
    if len(set(digests.values())) != 2:
        failures.append("control grid: CP 1 and 2 without a split should differ in bits")
    return failures


def check_pairs(args, work):
    """Trainer TP=2 x CP=2 zigzag vs the rollout's paged decode at rollout TP 1, 2, 4: where the
    KV blocks align (the rollout's fixed split equals the trainer's), the layer's output and the
    logprobs are bitwise equal; the rollout without a split is the control, and drifts."""
    failures = []
    out = os.path.join(work, "pairs.json")
    r = run(args, 4, ["--scope", "layer", "--seq-len", "256", "--tp-world-sizes", "2",
                      "--cp-world-sizes", "2", "--cp-layouts", "zigzag", "--kv-chunk-sizes", "32",
                      "--modes", "chunked_prefill,decode", "--rollout-tp-sizes", "1,2,4",
                      "--split-kv-policies", "fixed,disabled", "--fixed-split-size", "32",
                      "--include-dlogp"], out)
    if r.returncode != 0:
        return [f"pairs: exit {r.returncode}: {r.stderr[-2000:]}"]
    report = load(out)
    for c in report["paged_cases"]:  # the rollout's own layer drift, against FP32 on its inputs
        lo = c["paged"]["drift"]["layer_out"]
        print(f"paged {c['case_name']}: layer_out max {lo['max_abs']:.3g}")
        if not (0 < lo["max_abs"] < 0.1):
            failures.append(f"{c['case_name']}: layer_out max {lo['max_abs']} (BF16 drift expected)")
    pairs = [p for p in report["trainer_vs_rollout"]["pairs"]
             if p["trainer_merge"] == "canonical" and p["trainer_tp_reduction"] == "canonical"]
    aligned = [p for p in pairs if p["aligned"]]
    drift = [p for p in pairs if not p["aligned"]]
    for p in pairs:
        print(f"pair {p['trainer']} vs {p['rollout']}: aligned {p['aligned']}, layer_out "
              f"max {p['layer_out']['max_abs']:.3g}, logprob max {p['logprob']['max_abs']:.3g}")
    if len(aligned) != 3 or not all(p["layer_out"]["bitwise_equal"] and
                                    p["logprob"]["bitwise_equal"] for p in aligned):
        failures.append("pairs: the three aligned pairs (rollout TP 1, 2, 4) must be bitwise "
                        "equal in the layer's output and the logprobs")
    if not drift or any(p["layer_out"]["bitwise_equal"] for p in drift):
        failures.append("pairs: the rollout without a split (the control) must drift")
    return failures


# What the layer does not run yet, refused on every process before anything runs.
REFUSED = [
    (["--input-distribution", "sink"], "q, k and v are the layer's projections"),
    (["--cp-world-sizes", "16"], "the layer runs CP up to 8"),
    (["--seq-len", "72"], "is not a multiple of 16"),
]


def check_refusals(args, work):
    failures = []
    out = os.path.join(work, "refused.json")
    for flags, expect in REFUSED:
        r = run(args, 2, ["--scope", "layer", "--seq-len", "64", *flags], out)
        if (why := refusal_failure(r, flags, expect, out)) is not None:
            failures.append(why)
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpdrift", required=True)
    parser.add_argument("--mpirun", required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--full-backward", action="store_true",
                        help="the backward alone, every model's whole matrix on 1, 2 and 4 "
                             "processes (suite long)")
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as work:
        if args.full_backward:
            for name in args.models.split(","):
                failures += check_model(args, work, name, *MODELS[name], backward=True)
            return finish(failures, "layer backward, the whole matrix")
        failures += check_refusals(args, work)
        failures += check_controls(args, work)
        failures += check_pairs(args, work)
        for name in args.models.split(","):
            failures += check_model(args, work, name, *MODELS[name], backward=False)
        for name in args.models.split(","):
            failures += check_model(args, work, name, *MODELS[name], backward=True)
    return finish(failures, "layer matrix")


if __name__ == "__main__":
    sys.exit(main())
