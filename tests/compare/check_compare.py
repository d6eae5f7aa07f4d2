#!/usr/bin/env python3
"""cpdrift compare on streams NumPy and h5py write: JSON Lines (json.dumps), a directory of .npy
columns (numpy.save) and HDF5 (h5py), each read to the same figures, which must equal NumPy's
own FP64 computation of them; then the invalid comparisons, each status 2 with one line on
stderr, alone and under mpirun -np 2 (every process agreeing); and the gate's status 1.

usage: check_compare.py --cpdrift BUILD/cpdrift   (MPIRUN in the environment: also under mpirun)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:  # not installed: a skip, said plainly (CI installs both)
    print(f"skipped: {e} (apt-get install -y python3-h5py python3-numpy)")
    sys.exit(77)

FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


def run(cmd, np_=1):
    if np_ > 1:
        cmd = [os.environ["MPIRUN"], "-np", str(np_), "--oversubscribe"] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def streams(rng, n_seq=3, length=300, vocab=50):
    """Train and rollout records: the same tokens, logprobs drifting by a small noise, full
    vocabulary rows (log-softmax of random logits) for the exact KL."""
    seq = np.repeat(np.arange(n_seq), length)
    pos = np.tile(np.arange(length), n_seq)
    logits_t = rng.normal(size=(seq.size, vocab))
    logits_r = logits_t + rng.normal(scale=0.01, size=logits_t.shape)

    def log_softmax(x):
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    vt, vr = log_softmax(logits_t), log_softmax(logits_r)
    tok = rng.integers(0, vocab, size=seq.size)
    rows = np.arange(seq.size)
    # Each engine's top-5 of its own distribution (the ids may differ between them).
    top_t = np.argsort(-vt, axis=1)[:, :5]
    top_r = np.argsort(-vr, axis=1)[:, :5]
    return dict(sequence=seq, position=pos, token_id=tok, logprob=vt[rows, tok],
                vocab_logprobs=vt, top_ids=top_t,
                top_logprobs=np.take_along_axis(vt, top_t, axis=1)), \
        dict(sequence=seq, position=pos, token_id=tok, logprob=vr[rows, tok], vocab_logprobs=vr,
             top_ids=top_r, top_logprobs=np.take_along_axis(vr, top_r, axis=1))


def write_jsonl(path, s, order):
    with open(path, "w") as f:
        for i in order:
            f.write(json.dumps({"sequence": int(s["sequence"][i]), "position": int(s["position"][i]),
                                "token_id": int(s["token_id"][i]), "logprob": float(s["logprob"][i]),
                                "vocab_logprobs": [float(x) for x in s["vocab_logprobs"][i]],
                                "top_logprobs": [[int(a), float(b)] for a, b in
                                                 zip(s["top_ids"][i], s["top_logprobs"][i])]}) + "\n")


def write_npy(path, s):
    os.mkdir(path)
    for k, v in s.items():
        np.save(os.path.join(path, k + ".npy"), v.astype(np.int32) if v.dtype.kind == "i" else v)


def write_h5(path, s):
    with h5py.File(path, "w") as f:
        for k, v in s.items():
            f[k] = v


def oracle(t, r):
    """The figures in FP64 with NumPy: docs/rl-metrics.md's definitions."""
    d = t["logprob"] - r["logprob"]
    a = np.abs(d)
    rho = np.exp(d)
    p_r = np.exp(r["vocab_logprobs"])
    kl = (p_r * (r["vocab_logprobs"] - t["vocab_logprobs"])).sum(axis=1)
    jac, top1, common = [], [], []
    for i in range(d.size):
        ta = dict(zip(t["top_ids"][i].tolist(), t["top_logprobs"][i].tolist()))
        rb = dict(zip(r["top_ids"][i].tolist(), r["top_logprobs"][i].tolist()))
        shared = set(ta) & set(rb)
        jac.append(len(shared) / len(set(ta) | set(rb)))
        top1.append(max(ta, key=lambda v: (ta[v], -v)) == max(rb, key=lambda v: (rb[v], -v)))
        common += [abs(ta[v] - rb[v]) for v in shared]
    topk = {"overlap_jaccard.mean": np.mean(jac), "overlap_jaccard.min": np.min(jac),
            "top1_agreement": np.mean(top1), "common_abs_delta.mean": np.mean(common),
            "common_abs_delta.max": np.max(common)}
    return topk, {"abs_delta.mean": a.mean(), "abs_delta.std": a.std(), "abs_delta.max": a.max(),
            "abs_delta.p50": np.quantile(a, 0.5), "abs_delta.p99": np.quantile(a, 0.99),
            "importance_ratio.mean": rho.mean(), "importance_ratio.min": rho.min(),
            "importance_ratio.max": rho.max(),
            "importance_ratio.effective_sample_size": rho.sum() ** 2 / (rho ** 2).sum(),
            "kl_rollout_train.k1_mean": (-d).mean(),
            "kl_rollout_train.k3_mean": ((rho - 1) - d).mean(),
            "kl_rollout_train.exact_mean": kl.mean()}


def figure(report, dotted):
    v = report["rl_metrics"]
    for part in dotted.split("."):
        v = v[part]
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpdrift", required=True)
    args = ap.parse_args()
    exe = args.cpdrift
    rng = np.random.default_rng(2355)
    t, r = streams(rng)
    want_topk, want = oracle(t, r)
    with tempfile.TemporaryDirectory(prefix="cpdrift_compare_") as tmp:
        paths = {}
        order = rng.permutation(t["logprob"].size)  # file order is not the key order
        paths["jsonl"] = (os.path.join(tmp, "t.jsonl"), os.path.join(tmp, "r.jsonl"))
        write_jsonl(paths["jsonl"][0], t, order)
        write_jsonl(paths["jsonl"][1], r, range(r["logprob"].size))
        paths["npy"] = (os.path.join(tmp, "t_npy"), os.path.join(tmp, "r_npy"))
        write_npy(paths["npy"][0], t)
        write_npy(paths["npy"][1], r)
        paths["hdf5"] = (os.path.join(tmp, "t.h5"), os.path.join(tmp, "r.h5"))
        write_h5(paths["hdf5"][0], t)
        write_h5(paths["hdf5"][1], r)

        reports = {}
        for fmt, (tp, rp) in paths.items():
            out = os.path.join(tmp, fmt + ".json")
            rc, stdout, stderr = run([exe, "compare", tp, rp, "--output", out])
            check(rc == 0 and stderr == "", f"{fmt}: status 0, nothing on stderr (rc {rc}: {stderr.strip()})")
            check("# Comparison : valid" in stdout, f"{fmt}: the table ends with the verdict")
            if rc != 0:
                continue
            rep = json.load(open(out))
            reports[fmt] = rep
            check(rep["schema_version"] == "cpdrift_logprob_compare/v1", f"{fmt}: schema")
            check(rep["train"]["format"] == fmt and rep["alignment"]["active_tokens"] == t["logprob"].size,
                  f"{fmt}: format and every token aligned")
            # FP64 on both sides, summed in different orders: 1e-12 relative. k3 = (ρ − 1) − Δ
            # cancels to ≈ Δ²/2 ≈ 3e-5, so the 1-ulp differences between NumPy's exp and libm's
            # (≈ 2e-16 absolute) are ≈ 1e-11 of it: 1e-9 there.
            for name, value in want.items():
                got = figure(rep, name)
                tol = 1e-9 if name.endswith("k3_mean") else 1e-12
                check(abs(got - value) <= tol * max(abs(value), 1e-300),
                      f"{fmt}: {name} = {got!r}, NumPy {value!r}")
            top = rep["top_logprobs"]
            check(top["status"] == "available" and top["tokens"] == t["logprob"].size,
                  f"{fmt}: top-k figures over every token")
            for name, value in want_topk.items():
                got = top
                for part in name.split("."):
                    got = got[part]
                check(abs(got - value) <= 1e-12 * max(abs(value), 1e-300),
                      f"{fmt}: top_logprobs.{name} = {got!r}, NumPy {value!r}")
            files = rep["train"]["files"]
            check(all(len(f["sha256"]) == 64 and f["size_bytes"] > 0 for f in files),
                  f"{fmt}: each input file's size and SHA-256 recorded")
        if len(reports) == 3:
            a, b, c = (reports[k]["rl_metrics"] for k in ("jsonl", "npy", "hdf5"))
            for k in ("abs_delta", "importance_ratio", "kl_rollout_train"):
                check(a[k] == b[k] == c[k], f"formats agree bit for bit on {k}")
            tops = [reports[k]["top_logprobs"] for k in ("jsonl", "npy", "hdf5")]
            check(tops[0] == tops[1] == tops[2], "formats agree bit for bit on top_logprobs")

        # The gate: |Δ| max is about 0.04 here.
        rc, _, _ = run([exe, "compare", *paths["hdf5"], "--max-abs-delta", "1e-6", "--quiet"])
        check(rc == 1, f"--max-abs-delta below |Δ| max: status 1 (got {rc})")
        rc, _, _ = run([exe, "compare", *paths["hdf5"], "--max-abs-delta", "1", "--quiet"])
        check(rc == 0, f"--max-abs-delta above |Δ| max: status 0 (got {rc})")

        # Invalid comparisons, each written by h5py or NumPy: status 2, one line, no report.
        bad = {}
        tok = dict(r, token_id=r["token_id"].copy())
        tok["token_id"][5] += 1
        bad["token ids differ"] = (tok, "invalid comparison: the token ids differ at (sequence 0, position 5)")
        nan = dict(r, logprob=r["logprob"].copy())
        nan["logprob"][7] = np.nan
        bad["NaN logprob"] = (nan, "row 7: logprob is not finite")
        dup = dict(r, position=r["position"].copy())
        dup["position"][1] = 0
        bad["duplicate position"] = (dup, "(sequence 0, position 0) again")
        for what, (stream, expect) in bad.items():
            for fmt in ("hdf5", "npy"):
                p = os.path.join(tmp, f"bad_{fmt}_{len(os.listdir(tmp))}" + (".h5" if fmt == "hdf5" else ""))
                (write_h5 if fmt == "hdf5" else write_npy)(p, stream)
                out = os.path.join(tmp, "never.json")
                for np_ in (1, 2) if "MPIRUN" in os.environ else (1,):
                    rc, stdout, stderr = run([exe, "compare", paths[fmt][0], p, "--output", out], np_)
                    lines = [x for x in stderr.splitlines() if x.startswith("cpdrift:")]
                    check(rc == 2 and len(lines) == 1 and expect in lines[0] and stdout == "" and
                          not os.path.exists(out),
                          f"{what} ({fmt}, {np_} process{'es' if np_ > 1 else ''}): status 2, "
                          f"one line naming it (rc {rc}: {lines})")
        # A truncated HDF5 file.
        data = open(paths["hdf5"][1], "rb").read()
        cut = os.path.join(tmp, "cut.h5")
        open(cut, "wb").write(data[: len(data) // 2])
        rc, stdout, stderr = run([exe, "compare", paths["hdf5"][0], cut])
        check(rc == 2 and len(stderr.splitlines()) == 1 and cut + ": truncated: the file has" in stderr,
              f"truncated HDF5: status 2, one line naming the file (rc {rc}: {stderr.strip()})")

    print(f"{len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
