#!/usr/bin/env python3
"""cpdrift's report against the reference benchmark's, field by field.

For each command line of tests/reference-reports/README.md, runs cpdrift with it and then the
copy of the reference's compatibility check (tests/reference-reports/report-compat.py) against
the reference report of that command. Fails on any type difference; on any missing path that
tests/reference-reports/not_applicable.txt does not list; on a listed path the report has after
all (the list would be stale); and on any array element that lacks a field, or types it
differently, where every reference element at that place has it (report-compat.py collapses
array elements, so one case without a field would pass it). Checks that not_applicable.txt and
the "Not applicable" table of docs/report-contract.md list the same paths, and that the
contract's compatibility table gives the counts this run finds.

Negative controls: a report with one field removed (everywhere, or from one case only) or
retyped, a stale not-applicable entry, and a contract table missing a row must each be caught.

usage: report_compat.py --cpdrift BUILD/cpdrift --root SOURCE_ROOT
"""
import argparse
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

REFERENCE_DIR = os.path.join("tests", "reference-reports")
CONTRACT = os.path.join("docs", "report-contract.md")


def load_tool(root):
    """report-compat.py as a module: its kinds() and load() are the check's own."""
    path = os.path.join(root, REFERENCE_DIR, "report-compat.py")
    spec = importlib.util.spec_from_file_location("report_compat_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def reference_commands(root):
    """[(reference file, cpdrift arguments)] from the README's table."""
    rows = []
    with open(os.path.join(root, REFERENCE_DIR, "README.md"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\| `([\w.]+\.json)` \| `([^`]+)` \|\s*$", line)
            if m:
                rows.append((m.group(1), m.group(2).split()))
    return rows


def allow_list(root):
    with open(os.path.join(root, REFERENCE_DIR, "not_applicable.txt"), encoding="utf-8") as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def contract_section(text, heading):
    """The lines under `heading` (a "### ..." line) up to the next heading."""
    lines = text.splitlines()
    try:
        start = lines.index(heading) + 1
    except ValueError:
        return []
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def contract_not_applicable(text):
    """{path: reason} of the contract's "Not applicable" table."""
    rows = {}
    for line in contract_section(text, "### Not applicable"):
        m = re.match(r"^\| `(/[^`]*)` \| (.+?) \|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def contract_counts(text):
    """{reference file: (reference paths, present, not applicable)} of the contract's table,
    whose columns are: file, command, reference paths, present, added, retyped, not applicable
    (added and retyped are history: what issue 14 changed, not checked here)."""
    rows = {}
    for line in contract_section(text, "### Per reference command"):
        m = re.match(r"^\| `([\w.]+\.json)` \| `[^`]+` \|((?: \d+ \|){5})\s*$", line)
        if m:
            n = [int(x) for x in m.group(2).split("|") if x.strip()]
            rows[m.group(1)] = (n[0], n[1], n[4])
    return rows


def run_tool(tool_path, reference, candidate):
    """report-compat.py's verdict: (missing paths, type lines, reference path count)."""
    done = subprocess.run([sys.executable, tool_path, reference, candidate],
                          capture_output=True, text=True)
    missing, typed, total = [], [], None
    for line in done.stdout.splitlines():
        if line.startswith("missing  "):
            missing.append(line[len("missing  "):])
        elif line.startswith("type     "):
            typed.append(line[len("type     "):])
        elif m := re.match(r"^(\d+) reference paths: (\d+) missing, (\d+) of another type$", line):
            total = int(m.group(1))
    if total is None or done.returncode not in (0, 1) or \
            (done.returncode == 1) != bool(missing or typed):
        raise RuntimeError(f"report-compat.py gave no verdict (status {done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return missing, typed, total


def element_requirements(tool, doc):
    """Per collapsed array path: the (path, kind) pairs every reference element there has."""
    required = {}

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}/{k}")
        elif isinstance(x, list):
            for e in x:
                have = set(tool.kinds(e, f"{path}[]").items())
                required[path] = have if path not in required else required[path] & have
                walk(e, f"{path}[]")

    walk(doc, "")
    return required


def element_problems(tool, reference, candidate):
    """Array elements of the candidate that lack (or retype) what every reference element has."""
    required = element_requirements(tool, reference)
    problems = []

    def walk(x, path, where):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}/{k}", f"{where}/{k}")
        elif isinstance(x, list):
            for i, e in enumerate(x):
                have = tool.kinds(e, f"{path}[]")
                for p, kind in sorted(required.get(path, ())):
                    if p not in have:
                        problems.append(f"element {where}[{i}] lacks {p}")
                    elif "null" not in (kind, have[p]) and kind != have[p]:
                        problems.append(f"element {where}[{i}]: {p} is {have[p]}, reference {kind}")
                walk(e, f"{path}[]", f"{where}[{i}]")

    walk(candidate, "", "")
    return problems


def check_report(tool_path, tool, reference_path, candidate, allow, tmp):
    """Every problem of `candidate` (a parsed report) against the reference; and the counts."""
    path = os.path.join(tmp, "candidate.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(candidate, f, indent=1, sort_keys=True)
    missing, typed, total = run_tool(tool_path, reference_path, path)
    problems = [f"type difference {t}" for t in typed]
    problems += [f"missing {p} (not in not_applicable.txt)" for p in missing if p not in allow]
    reference = tool.load(reference_path)
    ref_kinds, cand_kinds = tool.kinds(reference), tool.kinds(candidate)
    problems += [f"stale: {p} is listed as not applicable but the report has it"
                 for p in sorted(allow) if p in ref_kinds and p in cand_kinds]
    problems += element_problems(tool, reference, candidate)
    return problems, total, [p for p in missing if p in allow]


def run_cpdrift(cpdrift, args, out):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run([cpdrift] + args + ["--quiet", "--output", out], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cpdrift {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def negative_controls(tool_path, tool, reference_path, report, allow, contract, tmp):
    """Each mutation must be caught, naming the path it broke. Returns the failures."""

    def every_case(f):
        def mutate(r):
            for c in r["cases"]:
                f(c)
        return mutate

    def set_root(r, key, sub, value):
        r[key][sub] = value

    controls = [
        ("a root field removed", "/te_context_parallel_merge/te_module",
         lambda r: r["te_context_parallel_merge"].pop("te_module")),
        ("a case field removed from every case", "/cases[]/model",
         every_case(lambda c: c.pop("model"))),
        ("a case field removed from one case only", "/cases[]/model",
         lambda r: r["cases"][3].pop("model")),
        ("a statistics object written as a number", "/cases[]/merge_order_probe/out",
         every_case(lambda c: c["merge_order_probe"].__setitem__("out", 0.0))),
        ("a count written as an array in one case", "/cases[]/topology/logical_cp_ranks",
         lambda r: r["cases"][5]["topology"].__setitem__("logical_cp_ranks", [0, 1])),
        ("a not-applicable path the report has after all", "/runtime/python",
         lambda r: set_root(r, "runtime", "python", "3.11")),
    ]
    failures = []
    for name, path, mutate in controls:
        broken = copy.deepcopy(report)
        mutate(broken)
        problems, _, _ = check_report(tool_path, tool, reference_path, broken, allow, tmp)
        caught = [p for p in problems if path in p]
        print(f"negative control: {name}: {'caught' if caught else 'NOT CAUGHT'}"
              + (f" ({caught[0]})" if caught else ""))
        if not caught:
            failures.append(f"negative control not caught: {name} ({path})")
    # A contract whose table lost a row no longer agrees with not_applicable.txt.
    row = next(line for line in contract.splitlines() if line.startswith("| `/runtime/python`"))
    shortened = contract_not_applicable(contract.replace(row + "\n", ""))
    caught = set(shortened) != allow
    print(f"negative control: a not-applicable row missing from the contract: "
          f"{'caught' if caught else 'NOT CAUGHT'}")
    if not caught:
        failures.append("negative control not caught: a contract table missing a row")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpdrift", required=True)
    ap.add_argument("--root", required=True, help="the source tree")
    a = ap.parse_args()
    tool_path, tool = load_tool(a.root)
    allow = allow_list(a.root)
    with open(os.path.join(a.root, CONTRACT), encoding="utf-8") as f:
        contract = f.read()
    failures = []

    documented = contract_not_applicable(contract)
    if set(documented) != allow:
        failures.append("docs/report-contract.md's Not applicable table and not_applicable.txt "
                        f"differ: only in the contract {sorted(set(documented) - allow)}, only "
                        f"in the list {sorted(allow - set(documented))}")
    counts = contract_counts(contract)
    commands = reference_commands(a.root)
    if len(commands) != 3:
        failures.append(f"expected 3 command lines in the README's table, found {len(commands)}")

    with tempfile.TemporaryDirectory() as tmp:
        smoke = None
        for name, args in commands:
            reference_path = os.path.join(a.root, REFERENCE_DIR, name)
            report = run_cpdrift(a.cpdrift, args, os.path.join(tmp, name))
            problems, total, not_applicable = check_report(tool_path, tool, reference_path, report,
                                                           allow, tmp)
            print(f"{name} ({' '.join(args)}): {total} reference paths, "
                  f"{total - len(not_applicable)} present, {len(not_applicable)} not applicable "
                  f"({', '.join(not_applicable)}), {len(problems)} problems")
            failures += [f"{name}: {p}" for p in problems]
            if name not in counts:
                failures.append(f"{name}: no row in the contract's Per reference command table")
            else:
                ref_paths, present, na = counts[name]
                found = (total, total - len(not_applicable), len(not_applicable))
                if (ref_paths, present, na) != found:
                    failures.append(f"{name}: the contract's table says {ref_paths} paths, "
                                    f"{present} present, {na} not applicable; this run: "
                                    f"{found[0]}, {found[1]}, {found[2]}")
            if args == ["--smoke"]:
                smoke = (reference_path, report)
        if smoke is None:
            failures.append("no --smoke command to run the negative controls on")
        else:
            failures += negative_controls(tool_path, tool, smoke[0], smoke[1], allow, contract,
                                          tmp)

    for f in failures:
        print("FAIL: " + f)
    print("report compatibility: " + ("FAILED" if failures else "OK"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
