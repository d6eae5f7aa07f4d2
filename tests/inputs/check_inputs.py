#!/usr/bin/env python3
"""cpdrift --inputs on files Python writes: the same q, k, v (values k/64, exact in float16,
bfloat16 and float32) stored before RoPE as float32 and BF16 HDF5 (h5py), a float16 .npy
directory (NumPy) and a BF16 safetensors file (written here from its specification), with
positions. The four runs must report the same bits (every case's output and LSE digests, under each of
the three protocols, which agree); a run on other values must not (the control); paged lanes
and pairs on the file keep every invariance; and h5py-written files that are wrong in one way
each end with status 2 and one line.

usage: check_inputs.py --cpdrift BUILD/cpdrift   (MPIRUN in the environment: 2 processes)
"""
import argparse
import json
import os
import struct
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
B, S, HQ, HKV, D = 2, 24, 32, 8, 128


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


def run(exe, args):
    cmd = [exe] + args
    if "MPIRUN" in os.environ:
        cmd = [os.environ["MPIRUN"], "-np", "2", "--oversubscribe"] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def tensors(seed):
    rng = np.random.default_rng(seed)
    make = lambda h: (rng.integers(-255, 256, size=(B, h, S, D)) / 64.0).astype(np.float32)
    positions = np.tile(np.arange(S, dtype=np.int64) + 1000, (B, 1))
    return {"q": make(HQ), "k": make(HKV), "v": make(HKV)}, positions


def write_h5(path, t, positions, rope_attr=True, q=None, rope=0):
    with h5py.File(path, "w") as f:
        for name, x in t.items():
            f[name] = x if q is None or name != "q" else q
            if rope_attr and name != "v":
                f[name].attrs["rope_applied"] = rope
        f["positions"] = positions


def write_h5_bf16(path, t, positions):
    """BF16 bits in uint16 with the attribute dtype = "bfloat16" as h5py writes a str by default:
    a variable-length string."""
    with h5py.File(path, "w") as f:
        for name, x in t.items():
            f[name] = (x.view(np.uint32) >> 16).astype(np.uint16)  # exact: 8 significant bits
            f[name].attrs["dtype"] = "bfloat16"
            if name != "v":
                f[name].attrs["rope_applied"] = 0
        f["positions"] = positions


def write_npy(path, t, positions):
    os.mkdir(path)
    for name, x in t.items():
        np.save(os.path.join(path, name + ".npy"), x.astype(np.float16))
    np.save(os.path.join(path, "positions.npy"), positions.astype(np.int32))
    with open(os.path.join(path, "inputs.json"), "w") as f:
        json.dump({"rope_applied": False}, f)


def write_safetensors(path, t, positions):
    header, blobs, offset = {}, [], 0
    for name, x in t.items():
        bits = (x.view(np.uint32) >> 16).astype("<u2").tobytes()  # exact: 8 significant bits
        header[name] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    p = positions.astype("<i8").tobytes()
    header["positions"] = {"dtype": "I64", "shape": list(positions.shape), "data_offsets": [offset, offset + len(p)]}
    blobs.append(p)
    header["__metadata__"] = {"rope_applied": "false"}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def digests(report):
    out = {}
    for c in report["cases"]:
        for cls, d in c["drift"].items():
            for part in ("out", "lse"):
                if isinstance(d, dict) and isinstance(d.get(part), dict) and "digest" in d[part]:
                    out[(c["case_name"], cls, part)] = d[part]["digest"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpdrift", required=True)
    exe = ap.parse_args().cpdrift
    t, positions = tensors(1)
    common = ["--tp-world-sizes", "1,2", "--cp-world-sizes", "2", "--kv-chunk-sizes", "none,8",
              "--protocols", "ag_rs,ring_kv,allgather_kv", "--quiet"]
    with tempfile.TemporaryDirectory(prefix="cpdrift_inputs_") as tmp:
        files = {"hdf5": os.path.join(tmp, "in.h5"), "npy": os.path.join(tmp, "in_npy"),
                 "safetensors": os.path.join(tmp, "in.safetensors"),
                 "hdf5 bf16": os.path.join(tmp, "in_bf16.h5")}
        write_h5(files["hdf5"], t, positions)
        write_h5_bf16(files["hdf5 bf16"], t, positions)
        write_npy(files["npy"], t, positions)
        write_safetensors(files["safetensors"], t, positions)
        reports = {}
        for fmt, path in files.items():
            out = os.path.join(tmp, fmt.replace(" ", "_") + ".json")
            rc, _, err = run(exe, ["--inputs", path, "--output", out] + common)
            # rc 1 is a drift check failing on these non-Gaussian values; the bits still count.
            check(rc in (0, 1) and os.path.exists(out), f"{fmt}: ran (rc {rc}: {err.strip()[:300]})")
            if os.path.exists(out):
                reports[fmt] = json.load(open(out))
                tgt = reports[fmt]["target"]
                check(tgt["inputs"]["format"] == fmt.split()[0] and tgt["batch"] == B and tgt["seq_len"] == S
                      and tgt["inputs"]["rope_applied"] is False and tgt["inputs"]["positions"] == "from the file",
                      f"{fmt}: target.inputs says what was read")
        if len(reports) == len(files):
            d = {k: digests(v) for k, v in reports.items()}
            check(len(d["hdf5"]) >= 24, f"{len(d['hdf5'])} digests per run")
            # Every protocol moves the file's inputs to the same bits (names: "_ring_kv", …).
            by_protocol = {}
            for (name, cls, part), digest in d["hdf5"].items():
                base = name.replace("_ring_kv", "").replace("_allgather_kv", "")
                by_protocol.setdefault((base, cls, part), set()).add(digest)
            check(all(len(v) == 1 for v in by_protocol.values()) and
                  len(by_protocol) * 3 == len(d["hdf5"]),
                  "ag_rs, ring_kv and allgather_kv: the same bits on the file's inputs")
            check(d["hdf5"] == d["npy"] == d["safetensors"] == d["hdf5 bf16"],
                  "float32 HDF5, float16 .npy, BF16 safetensors and BF16 HDF5 (h5py's string "
                  "attribute) of the same values: the same bits")
        # The rollout side on the same file: paged prefill and decode at rollout TP 1 and 2, and
        # the trainer-vs-rollout pairs; every required invariance holds bit for bit.
        out = os.path.join(tmp, "paged.json")
        rc, _, err = run(exe, ["--inputs", files["hdf5"], "--modes", "prefill,paged_prefill,decode",
                               "--rollout-tp-sizes", "1,2", "--include-dlogp", "--output", out] + common[:2] + ["--quiet"])
        if os.path.exists(out):
            rep = json.load(open(out))
            inv = [(c["case_name"], k, v) for c in rep["paged_cases"]
                   for k, v in c["paged"]["invariance"].items() if isinstance(v, dict) and v.get("required")]
            check(len(rep["paged_cases"]) >= 4 and len(inv) >= 8 and all(v["passed"] for _, _, v in inv),
                  f"paged cases on the file: {len(inv)} required invariances, all passed")
            pairs = rep["trainer_vs_rollout"]
            check(pairs["status"] == "available" and len(pairs["pairs"]) > 0,
                  f"trainer-vs-rollout pairs on the file: {len(pairs['pairs'])}")
        else:
            check(False, f"paged run on the file (rc {rc}: {err.strip()[:300]})")
        # Control: other values give other bits.
        t2, _ = tensors(2)
        other = os.path.join(tmp, "other.h5")
        write_h5(other, t2, positions)
        out = os.path.join(tmp, "other.json")
        run(exe, ["--inputs", other, "--output", out] + common)
        if "hdf5" in reports and os.path.exists(out):
            check(digests(json.load(open(out))) != digests(reports["hdf5"]), "other values, other bits (control)")
        # rope_applied as h5py stores a Python bool (an HDF5 enum): read as the integer 0.
        boolean = os.path.join(tmp, "bool.h5")
        write_h5(boolean, t, positions, rope=False)
        out = os.path.join(tmp, "bool.json")
        rc, _, err = run(exe, ["--inputs", boolean, "--output", out] + common)
        check("hdf5" in reports and os.path.exists(out) and
              digests(json.load(open(out))) == digests(reports["hdf5"]),
              f"rope_applied a boolean: the same bits (rc {rc}: {err.strip()[:300]})")

        # Wrong files, written by h5py: status 2, one line naming the file.
        bad = {
            "16 query heads": (lambda p: write_h5(p, t, positions, q=t["q"][:, :16]), "q has shape [2, 16, 24, 128]"),
            "no rope_applied": (lambda p: write_h5(p, t, positions, rope_attr=False), "rope_applied"),
            "rope_applied a string": (lambda p: write_h5(p, t, positions, rope="false"),
                                      "need an integer attribute rope_applied"),
            "float64": (lambda p: write_h5(p, t, positions, q=t["q"].astype(np.float64)), "float64"),
            "positions [2, 23]": (lambda p: write_h5(p, t, positions[:, :23]), "positions has shape [2, 23]"),
        }
        for what, (writer, says) in bad.items():
            p = os.path.join(tmp, what.replace(" ", "_") + ".h5")
            writer(p)
            rc, out, err = run(exe, ["--inputs", p] + common)
            # cpdrift's own lines (mpirun adds its notice of a non-zero exit).
            lines = [x for x in err.splitlines() if x.startswith("cpdrift:")]
            check(rc == 2 and len(lines) == 1 and p in lines[0] and says in lines[0] and out == "",
                  f"{what}: status 2, one line naming it (rc {rc}: {lines})")
        data = open(files["hdf5"], "rb").read()
        cut = os.path.join(tmp, "cut.h5")
        open(cut, "wb").write(data[: len(data) // 3])
        rc, out, err = run(exe, ["--inputs", cut] + common)
        lines = [x for x in err.splitlines() if x.startswith("cpdrift:")]
        check(rc == 2 and len(lines) == 1 and cut + ": truncated: the file has" in lines[0],
              f"truncated HDF5: status 2, one line (rc {rc}: {lines})")
    print(f"{len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
