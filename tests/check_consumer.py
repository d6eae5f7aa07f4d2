#!/usr/bin/env python3
"""The public headers as another project uses them: installed, found through pkg-config, built
with only what `pkg-config --cflags cpdrift` gives plus the compiler's defaults (and once more
optimised for this CPU, where a compiler may fuse a*b+c on its own), the consumer's merges must
equal cpdrift's bit for bit; its run with one input bit flipped must not (the negative control).

usage: check_consumer.py --build DIR --source DIR --reference EXE --cxx CXX
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--cxx", required=True)
    a = p.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as root:
        run(["meson", "install", "-C", a.build, "--no-rebuild", "--quiet", "--tags", "devel",
             "--destdir", root])
        pcs = glob.glob(os.path.join(root, "**", "cpdrift.pc"), recursive=True)
        headers = glob.glob(os.path.join(root, "**", "cpdrift", "block_merge.h"), recursive=True)
        if len(pcs) != 1 or len(headers) != 1:
            sys.exit(f"check_consumer: the install holds {len(pcs)} cpdrift.pc and "
                     f"{len(headers)} cpdrift/block_merge.h (one of each expected)")
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]),
                   PKG_CONFIG_SYSROOT_DIR=root)
        cflags = run(["pkg-config", "--cflags", "cpdrift"], env=env).split()
        print("pkg-config --cflags cpdrift:", " ".join(cflags))
        source = os.path.join(a.source, "merge_consumer.cpp")
        reference = run([a.reference]).split()
        if len(reference) < 1000:
            sys.exit(f"check_consumer: the reference printed {len(reference)} words")
        for name, extra in (("defaults", []), ("-O2 -march=native", ["-O2", "-march=native"])):
            exe = os.path.join(root, "consumer")
            run([a.cxx] + extra + cflags + ["-I" + a.source, source, "-o", exe])
            ours = run([exe]).split()
            first = next((i for i, (x, y) in enumerate(zip(ours, reference)) if x != y), None)
            if len(ours) != len(reference) or first is not None:
                failures.append(f"built with {name}: {len(ours)} words vs {len(reference)}, first "
                                f"difference at word {first}")
            else:
                print(f"built with {name}: {len(ours)} words, equal to cpdrift's bit for bit")
            flipped = run([exe, "--flip"]).split()
            if flipped == reference:
                failures.append(f"built with {name}: the flipped input gave the same bits (the "
                                "comparison cannot fail)")
        # What the flags are for, said but not judged: the same optimised build without them.
        exe = os.path.join(root, "contracting")
        run([a.cxx, "-O2", "-march=native", "-I" + os.path.dirname(headers[0]) + "/..",
             "-I" + a.source, source, "-o", exe])
        same = run([exe]).split() == reference
        print("built with -O2 -march=native but without pkg-config's flags: "
              + ("the same bits (this compiler fused nothing here)" if same else
                 "different bits (a*b+c fused): the flags are needed"))
    if failures:
        print("check_consumer: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
