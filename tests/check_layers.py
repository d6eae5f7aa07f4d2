#!/usr/bin/env python3
"""Refuses a source that includes a header of a higher layer (docs/architecture.md).

A build step (meson.build runs it before anything compiles, so the build fails): every file
under src/ and include/cpdrift/ belongs to the layer whose folder (or file) names it, and each
`#include "..."` it makes must resolve to a file of its own layer or a lower one. A file that
belongs to no layer fails too: a new folder must take its place in the table first.

usage: check_layers.py --root DIR --stamp FILE LAYER...   where LAYER is name:folder,folder,...
(folders of src/ and include/cpdrift/, or single files under src/; the first is the lowest).
"""
import argparse
import os
import re
import sys

# Quoted includes, and the project's headers in angle brackets too.
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(cpdrift/[^>]+)>)', re.MULTILINE)
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".h.in")


def layer_table(specs):
    """{folder or file: (index, layer name)}, most specific first."""
    table = {}
    for index, spec in enumerate(specs):
        name, _, members = spec.partition(":")
        for member in members.split(","):
            table[member] = (index, name)
    return table


def layer_of(path, table):
    """The layer of a path relative to the root, or None."""
    for prefix in ("src/", "include/cpdrift/"):
        if path.startswith(prefix):
            rel = path[len(prefix):]
            if rel in table:  # a single file named in the table
                return table[rel]
            return table.get(rel.split("/")[0])
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--stamp", required=True)
    p.add_argument("layers", nargs="+")
    args = p.parse_args()
    table = layer_table(args.layers)
    root = os.path.abspath(args.root)
    errors = []
    for top in ("src", "include/cpdrift"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                mine = layer_of(path, table)
                if mine is None:
                    errors.append(f"{path}: in no layer (add its folder to `layers` in meson.build)")
                    continue
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    text = f.read()
                for match in INCLUDE.finditer(text):
                    included = match.group(1) or match.group(2)
                    if included.startswith("cpdrift/"):
                        target = "include/" + included
                    else:
                        target = os.path.normpath(os.path.join(os.path.dirname(path), included))
                    theirs = layer_of(target, table)
                    if theirs is not None and theirs[0] > mine[0]:
                        line = text.count("\n", 0, match.start()) + 1
                        errors.append(f"{path}:{line}: the {mine[1]} layer includes \"{included}\" "
                                      f"of the higher {theirs[1]} layer")
    if errors:
        print("check_layers: a lower layer reaches up (docs/architecture.md):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        sys.exit(1)
    with open(args.stamp, "w", encoding="utf-8") as f:
        f.write("// Written by tests/check_layers.py: every include points to its layer or below.\n")


if __name__ == "__main__":
    main()
