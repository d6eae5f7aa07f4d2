#!/usr/bin/env python3
"""A NumPy user's view of a cpdrift dump: h5py finds the layout docs/inspect.md documents.

Runs cpdrift (--cpdrift) with a dump, then with Debian's python3-h5py reads it back: the root's
attributes, every case group's attributes, every tensor's dtype, rank, extents and attributes,
the report inside; then exports tensors with cpdrift-inspect (--inspect) and loads them with
python3-numpy, equal to h5py's read of the same datasets. Exit 77 (meson's skip) when h5py or
NumPy is missing: `apt-get install -y python3-h5py python3-numpy`.

usage: check_dump.py --cpdrift BIN --inspect BIN
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
except ImportError as e:  # not installed: a skip, said plainly
    print(f"skipped: {e} (apt-get install -y python3-h5py python3-numpy)")
    sys.exit(77)

CASE = "qwen3_8b_tp1_cp2_chunk4_bf16"
PAGED_PREFIX = "qwen3_8b_tp1_"
ROOT_ATTRIBUTES = {  # name: type
    "schema_version": str, "producer": str, "created_at_utc": str, "command": str,
    "model": str, "batch": int, "seq_len": int, "num_query_heads": int, "num_kv_heads": int,
    "head_dim": int, "seed": int, "dtype": str, "rope": str, "layout_note": str,
}
CASE_ATTRIBUTES = {"tp_world_size": int, "cp_world_size": int, "split": (int, str),
                   "layout": str, "protocol": str}
PAGED_ATTRIBUTES = {"kv_lens": str, "q_len": int, "page_size": int, "shared_prefix_tokens": int}
LEGS = ["reference_fp32", "candidate_fp32", "candidate_bf16", "bf16_kernel", "te_p2p",
        "ring_fp32", "nccl_rs"]


def text(value):
    """An HDF5 fixed-length string attribute as h5py returns it (bytes) → str."""
    return value.decode() if isinstance(value, bytes) else value


def check_attributes(obj, wanted, where):
    for name, kind in wanted.items():
        assert name in obj.attrs, f"{where}: no attribute {name}"
        value = obj.attrs[name]
        value = text(value) if isinstance(value, bytes) else value
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = any(isinstance(value, str) if k is str else np.issubdtype(type(value), np.integer)
                 for k in kinds)
        assert ok, f"{where}: attribute {name} = {value!r} is not {kind}"


def check_tensor(d, root, path, heads, length):
    """A tensor dataset: little-endian FP32, [B, H, S(, D)], the documented attributes."""
    assert d.dtype == np.dtype("<f4"), f"{path}: dtype {d.dtype}"
    shape = text(d.attrs["shape"])
    assert d.ndim == (4 if shape.endswith(", D]") else 3), f"{path}: {d.shape} vs {shape}"
    want = [root.attrs["batch"], heads, length] + ([root.attrs["head_dim"]] if d.ndim == 4 else [])
    assert list(d.shape) == want, f"{path}: {d.shape}, want {want}"
    original = text(d.attrs["original_dtype"])
    assert original in ("float32", "bfloat16"), f"{path}: original_dtype {original}"
    assert text(d.attrs.get("stored_dtype", b"float32")) == "float32", path
    values = d[()]
    assert np.isfinite(values).all(), f"{path}: non-finite values"
    if original == "bfloat16":  # BF16 stored exactly as FP32: the low 16 bits are zero
        assert not (values.view(np.uint32) & 0xFFFF).any(), f"{path}: not BF16-exact"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpdrift", required=True)
    p.add_argument("--inspect", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpdrift_h5py_") as work:
        h5, report_path = os.path.join(work, "d.h5"), os.path.join(work, "r.json")
        subprocess.run([args.cpdrift, "--seq-len", "16", "--tp-world-sizes", "1",
                        "--cp-world-sizes", "2", "--kv-chunk-sizes", "4", "--include-backward",
                        "--include-dlogp", "--dump-inputs", "--modes",
                        "chunked_prefill,paged_prefill,decode", "--page-size", "4",
                        "--fixed-split-size", "8", "--quiet", "--dump", h5, "--output",
                        report_path], check=True)
        report = json.load(open(report_path))
        checked = 0
        with h5py.File(h5, "r") as f:
            check_attributes(f, ROOT_ATTRIBUTES, "/")
            assert text(f.attrs["schema_version"]) == "ws2_cp_attention_drift/v2"
            hq, hkv, s = f.attrs["num_query_heads"], f.attrs["num_kv_heads"], f.attrs["seq_len"]
            assert json.loads(text(f["report_json"][()])) == report, "/report_json"
            for name, heads in (("q", hq), ("k", hkv), ("v", hkv)):
                check_tensor(f["inputs"][name], f, f"/inputs/{name}", heads, s)
                checked += 1
            assert sorted(f["cases"]) == sorted(c["case_name"] for c in report["cases"])
            group = f["cases"][CASE]
            check_attributes(group, CASE_ATTRIBUTES, CASE)
            assert (group.attrs["tp_world_size"], group.attrs["cp_world_size"],
                    group.attrs["split"]) == (1, 2, 4)
            for leg in LEGS:
                for t in ("out", "lse"):
                    check_tensor(group[leg][t], f, f"{CASE}/{leg}/{t}", hq, s)
                    checked += 1
            for leg in ("candidate_fp32", "reference_fp32"):
                for g, heads in (("dq", hq), ("dk", hkv), ("dv", hkv)):
                    d = group[leg][g]
                    assert text(d.attrs["heads"]) == ("query" if g == "dq" else "kv")
                    check_tensor(d, f, f"{CASE}/{leg}/{g}", heads, s)
                    checked += 1
            for leg in ("candidate", "reference"):
                check_tensor(group[leg]["logp"], f, f"{CASE}/{leg}/logp", 1, s)
                checked += 1
            assert sorted(f["paged_cases"]) == sorted(c["case_name"] for c in report["paged_cases"])
            for name, paged in f["paged_cases"].items():
                assert name.startswith(PAGED_PREFIX), name
                check_attributes(paged, PAGED_ATTRIBUTES, name)
                for leg in ("candidate", "reference"):
                    for t in ("out", "lse"):
                        check_tensor(paged[leg][t], f, f"{name}/{leg}/{t}", hq,
                                     paged.attrs["q_len"])
                        checked += 1
            # A digest of the report is the SHA-256 of the dataset's bytes (BF16 bit patterns
            # for a BF16 tensor): what anyone can recompute from h5py.
            import hashlib
            out = group["candidate_fp32"]["out"][()]
            digest = report["cases"][0]["drift"]["cp_merge_fp32"]["out"]["digest"]
            assert hashlib.sha256(out.astype("<f4").tobytes()).hexdigest() == digest
            bf16 = group["candidate_bf16"]["out"][()]
            digest = report["cases"][0]["drift"]["dtype_path_vs_fp32"]["out"]["digest"]
            halves = (bf16.view(np.uint32) >> 16).astype("<u2")
            assert hashlib.sha256(halves.tobytes()).hexdigest() == digest
            # export: numpy.load gives h5py's array, same shape, dtype and bits.
            for tensor in (f"{CASE}/candidate_bf16/out", f"{CASE}/candidate_fp32/dk",
                           f"{CASE}/candidate/logp", "/inputs/q"):
                npy = os.path.join(work, "x.npy")
                subprocess.run([args.inspect, "export", h5, tensor, "-o", npy], check=True,
                               stdout=subprocess.DEVNULL)
                loaded = np.load(npy)
                path = tensor if tensor.startswith("/") else "/cases/" + tensor
                want = f[path][()]
                assert loaded.dtype == np.dtype("<f4") and loaded.shape == want.shape, tensor
                assert loaded.flags["C_CONTIGUOUS"], tensor
                assert np.array_equal(loaded.view(np.uint32), want.view(np.uint32)), tensor
        print(f"ok: h5py read {checked} tensors and the documented attributes; numpy.load "
              f"read 4 exports bit for bit (h5py {h5py.__version__}, NumPy {np.__version__})")


if __name__ == "__main__":
    main()
