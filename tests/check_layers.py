#!/usr/bin/env python3
"""Refuses a source that includes a header of a higher layer (docs/architecture.md).

A build step (meson.build runs it before anything compiles, so the build fails): each folder of
src/ is one layer, listed bottom up, and include/cpdrift/ (the public API) sits below them all.
Every `#include "..."` a file makes must resolve to a file of its own layer or a lower one, and
a public header may include only public headers. A folder of src/ that is in no layer fails
too: a new folder must take its place in the list first.

usage: check_layers.py --root DIR --stamp FILE LAYER...   (the folders of src/, lowest first)
       check_layers.py --self-test   (the negative controls: a tree that breaks each rule)
"""
import argparse
import os
import re
import sys

# Quoted includes, and the project's headers in angle brackets too.
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(cpdrift/[^>]+)>)', re.MULTILINE)
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".h.in")
PUBLIC = (-1, "public API (include/cpdrift)")


def layer_of(path, layers):
    """(index, name) of the layer of a path relative to the root, or None outside src/ and
    include/cpdrift/; (None, folder) for a folder of src/ in no layer."""
    if path.startswith("include/cpdrift/"):
        return PUBLIC
    if path.startswith("src/"):
        folder = path.split("/")[1]
        return (layers.index(folder), folder) if folder in layers else (None, folder)
    return None


def resolve(path, included, root):
    """The file an include names, relative to the root: beside the includer, else under src/ or
    include/ (the build's include directories)."""
    beside = os.path.normpath(os.path.join(os.path.dirname(path), included))
    if os.path.exists(os.path.join(root, beside)):
        return beside
    for top in ("include", "src"):
        if os.path.exists(os.path.join(root, top, included)):
            return os.path.join(top, included)
    return None  # a system or generated header


def self_test():
    """Each rule broken once in a small tree must be reported; the same tree within the rules,
    not."""
    import tempfile

    cases = {
        "src/core/low.cpp": ('#include "cli/high.h"\n', "the core layer includes"),
        "include/cpdrift/api.h": ('#include "core/low.h"\n', "the public API"),
        "src/stray/x.cpp": ("", "src/stray is in no layer"),
    }
    for path, (text, expect) in cases.items():
        with tempfile.TemporaryDirectory() as root:
            for name, body in (("src/core/low.h", ""), ("src/cli/high.h", '#include "core/low.h"\n'),
                               (path, text)):
                os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
                with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                    f.write(body)
            errors = check(root, ["core", "cli"])
            if not any(expect in e for e in errors):
                sys.exit(f"check_layers --self-test: {path} ({expect!r}) was not reported: {errors}")
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "src/cli"))
        with open(os.path.join(root, "src/cli/ok.cpp"), "w", encoding="utf-8") as f:
            f.write('#include "cpdrift/bf16.h"\n')
        if check(root, ["core", "cli"]):
            sys.exit("check_layers --self-test: a tree within the rules was refused")
    print("check_layers --self-test: every broken rule reported, the clean tree accepted")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--stamp", required=True)
    p.add_argument("layers", nargs="+")
    args = p.parse_args()
    errors = check(os.path.abspath(args.root), args.layers)
    if errors:
        print("check_layers: a lower layer reaches up (docs/architecture.md):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        sys.exit(1)
    with open(args.stamp, "w", encoding="utf-8") as f:
        f.write("// Written by tests/check_layers.py: every include points to its layer or below.\n")


def check(root, layers):
    """Every broken rule under `root`, one line each."""
    errors = []
    for top in ("src", "include/cpdrift"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                mine = layer_of(path, layers)
                if mine[0] is None:
                    errors.append(f"{path}: src/{mine[1]} is in no layer (add it to `layers` in "
                                  "meson.build)")
                    continue
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    text = f.read()
                for match in INCLUDE.finditer(text):
                    included = match.group(1) or match.group(2)
                    target = resolve(path, included, root)
                    theirs = layer_of(target, layers) if target else None
                    if theirs is None or theirs[0] is None or theirs[0] <= mine[0]:
                        continue
                    line = text.count("\n", 0, match.start()) + 1
                    errors.append(f"{path}:{line}: the {mine[1]} layer includes \"{included}\" "
                                  f"of the higher {theirs[1]} layer")
    return errors


if __name__ == "__main__":
    main()
