#!/usr/bin/env python3
"""docs/cli.md against what the programs print with --help, option by option.

docs/cli.md is cut into scopes by markers, `<!-- cli-scope: NAME -->`, each running to the next
marker:

  cpdrift                      every option `cpdrift --help` prints (and `cpdrift run|bench|
                               accept|plan --help`, which print the same text)
  cpdrift off-help             options cpdrift accepts but --help does not print: a table whose
                               rows start `| `--flag` | `command` |`
  cpdrift-inspect              every option `cpdrift-inspect --help` prints
  cpdrift-inspect COMMAND      every option `cpdrift-inspect COMMAND --help` prints, one scope
                               per command the top-level help lists
  none                         prose: any option named there must be one some --help prints

In each program scope the `--long` options of the help text and of the scope must be the same
set (the `cpdrift` scope may also name an off-help option), and a short option the help prints
as `-x, --long` must appear in the scope. Every off-help option must be absent from --help (else
the entry is stale) and accepted by its command: `cpdrift COMMAND FLAG --help` or `cpdrift
COMMAND FLAG 1 --help` exits 0 (an unknown option exits 2; a made-up one is probed as a
control). Every inspect command needs its scope, and no scope may name a command that does not
exist. Options of other programs (mpirun, sbatch) have no place in cli.md.

Every option a program's help prints (but the inspect launcher's, which has none of its own)
must also have a row in its scope's option tables: the first cell of a `| ... |` line.

Negative controls, on copies of the document: one option's row removed (cpdrift's; a
subcommand's, whose synopsis still names it), one option removed from a scope, a made-up option, an option in the wrong subcommand's scope, a short option
removed, a missing subcommand scope, an off-help entry that --help prints, one the program does
not accept. Each must be refused with the expected message, or the test fails.

usage: check_cli_docs.py --cpdrift BUILD/cpdrift [--inspect BUILD/cpdrift-inspect]
                         (--root SOURCE_ROOT | --doc PATH) [--no-controls]
Without --inspect (a build without HDF5) the inspect scopes are not checked.
"""
import argparse
import os
import re
import subprocess
import sys

CPDRIFT_COMMANDS = ["run", "bench", "accept", "plan", "compare"]
MARKER = re.compile(r"^<!--[ \t]*cli-scope:[ \t]*(.*?)[ \t]*-->[ \t]*$", re.M)
LONG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
SHORT_IN_HELP = re.compile(r"(?m)^\s+(-[a-zA-Z]),\s+--")
OFF_HELP_ROW = re.compile(r"(?m)^\|\s*`(--[a-z0-9-]+)[^`]*`\s*\|\s*`([a-z]+)`\s*\|")
MADE_UP = "--no-such-option"


def run(argv):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def long_options(text):
    return set(LONG.findall(text))


def short_options(text):
    return set(SHORT_IN_HELP.findall(text))


def has_short(text, short):
    return re.search(r"(?<![\w-])" + re.escape(short) + r"(?![\w-])", text) is not None


def first_cells(text):
    """The first cells of the Markdown table rows in `text`, joined: where options have rows."""
    return "\n".join(line.split("|")[1] for line in text.splitlines()
                     if line.startswith("|") and line.count("|") >= 3)


class Programs:
    """The help texts, read once, and the off-help probe."""

    def __init__(self, cpdrift, inspect):
        self.cpdrift = cpdrift
        self.helps = {}  # scope name -> help text
        texts = []
        for argv in [[cpdrift, "--help"]] + [[cpdrift, c, "--help"] for c in CPDRIFT_COMMANDS]:
            rc, out, err = run(argv)
            if rc != 0 or not out.strip():
                raise SystemExit(f"FAIL: {' '.join(argv)} exited {rc}: {err.strip()}")
            texts.append(out)
        self.helps["cpdrift"] = "\n".join(texts)
        self.inspect_commands = []
        if inspect:
            rc, out, err = run([inspect, "--help"])
            if rc != 0:
                raise SystemExit(f"FAIL: {inspect} --help exited {rc}: {err.strip()}")
            self.helps["cpdrift-inspect"] = out
            block = out.split("commands:", 1)[1] if "commands:" in out else ""
            block = block.split("\n\n", 1)[0]
            self.inspect_commands = re.findall(r"(?m)^  ([a-z]+) ", block)
            if not self.inspect_commands:
                raise SystemExit("FAIL: cpdrift-inspect --help lists no commands")
            for c in self.inspect_commands:
                rc, sub, err = run([inspect, c, "--help"])
                if rc != 0 or not sub.strip():
                    raise SystemExit(f"FAIL: cpdrift-inspect {c} --help exited {rc}: {err.strip()}")
                self.helps["cpdrift-inspect " + c] = sub
        self.all_printed = set().union(*(long_options(t) for t in self.helps.values()))
        self._refusals = {}

    def refusal(self, command, flag):
        """'' when `cpdrift COMMAND FLAG [1] --help` exits 0 (the flag is parsed, not unknown),
        else what the last attempt printed on stderr (its exit status when it printed nothing)."""
        key = (command, flag)
        if key not in self._refusals:
            why = ""
            for value in ([], ["1"]):
                rc, _, err = run([self.cpdrift, command, flag] + value + ["--help"])
                if rc == 0:
                    why = ""
                    break
                why = err.strip().splitlines()[-1] if err.strip() else f"exit status {rc}"
            self._refusals[key] = why
        return self._refusals[key]


def scopes(doc):
    """[(name, text)] in document order; text before the first marker is scope 'none'."""
    parts = MARKER.split(doc)
    result = [("none", parts[0])]
    for i in range(1, len(parts), 2):
        result.append((parts[i], parts[i + 1]))
    return result


def check(doc, programs):
    """The list of what is wrong with `doc` (empty: it agrees with the programs)."""
    errors = []
    found = scopes(doc)
    names = [n for n, _ in found]
    for name in set(names):
        if name != "none" and names.count(name) > 1:
            errors.append(f"scope '{name}' appears {names.count(name)} times")
    text_of = {}
    for name, text in found:
        text_of[name] = text_of.get(name, "") + text

    known = {"none", "cpdrift", "cpdrift off-help"}
    if "cpdrift-inspect" in programs.helps:
        known |= {"cpdrift-inspect"} | {"cpdrift-inspect " + c for c in programs.inspect_commands}
    for name in text_of:
        if name not in known and not (name.startswith("cpdrift-inspect")
                                      and "cpdrift-inspect" not in programs.helps):
            errors.append(f"scope '{name}': no such program or command")

    # Off-help entries: not printed, but accepted.
    off_help = {}
    for flag, command in OFF_HELP_ROW.findall(text_of.get("cpdrift off-help", "")):
        off_help[flag] = command
        if command not in CPDRIFT_COMMANDS:
            errors.append(f"off-help {flag}: '{command}' is not a cpdrift command")
        elif flag in long_options(programs.helps["cpdrift"]):
            errors.append(f"off-help {flag}: cpdrift --help prints it now (stale entry: document "
                          f"it with its group)")
        elif programs.refusal(command, flag):
            errors.append(f"off-help {flag}: `cpdrift {command}` does not accept it "
                          f"({programs.refusal(command, flag)})")
    stray = long_options(text_of.get("cpdrift off-help", "")) - set(off_help) \
        - programs.all_printed
    for flag in sorted(stray):
        errors.append(f"scope 'cpdrift off-help' names {flag}, which is neither a row of its "
                      f"table nor printed by any --help")

    # Each program scope: the same options as its help.
    for name, help_text in programs.helps.items():
        if name not in text_of:
            errors.append(f"scope '{name}' is missing (its --help prints "
                          f"{' '.join(sorted(long_options(help_text))) or 'no options'})")
            continue
        text = text_of[name]
        printed, documented = long_options(help_text), long_options(text)
        allowed = printed | (set(off_help) if name == "cpdrift" else set())
        for flag in sorted(printed - documented):
            errors.append(f"{flag}: printed by `{name} --help` but missing from its scope")
        for flag in sorted(documented - allowed):
            errors.append(f"{flag}: named in scope '{name}' but not printed by `{name} --help`")
        for short in sorted(short_options(help_text)):
            if not has_short(text, short):
                errors.append(f"{short}: printed by `{name} --help` but missing from its scope")
        # A program's own options each have a row in its scope's tables. The inspect launcher's
        # help has none of its own (it names diff's --atol and cpdrift's --dump in passing).
        if name != "cpdrift-inspect":
            rows = first_cells(text)
            for flag in sorted(printed & documented):
                if flag not in long_options(rows):
                    errors.append(f"{flag}: printed by `{name} --help` but has no row in the "
                                  f"option tables of its scope")
            for short in sorted(short_options(help_text)):
                if has_short(text, short) and not has_short(rows, short):
                    errors.append(f"{short}: printed by `{name} --help` but has no row in the "
                                  f"option tables of its scope")

    # Prose: only options some program prints (or an off-help entry).
    for flag in sorted(long_options(text_of.get("none", "")) - programs.all_printed
                       - set(off_help)):
        errors.append(f"{flag}: named in cli.md but printed by no --help (launcher options "
                      f"belong in getting-started.md or troubleshooting.md)")
    return errors


def replace_in_scope(doc, scope, old, new):
    """`doc` with every `old` option token in `scope` replaced by `new`."""
    out, parts = [], MARKER.split(doc)
    pattern = re.compile(r"(?<![\w-])" + re.escape(old) + r"(?![\w-])")
    for i, part in enumerate(parts):
        if i % 2 == 0 and (parts[i - 1] if i else "none") == scope:
            part = pattern.sub(new, part)
        out.append(part if i % 2 == 0 else f"<!-- cli-scope: {part} -->")
    return "".join(out)


def append_to_scope(doc, scope, line):
    """`doc` with `line` first in `scope` (a new section at the end when it has none)."""
    marker = f"<!-- cli-scope: {scope} -->\n"
    if marker not in doc:
        return doc + "\n" + marker + line + "\n"
    return doc.replace(marker, marker + line + "\n", 1)


def controls(doc, programs):
    """(description, mutated document, words an error must contain)."""
    result = [
        ("the --vocab-size row removed from cpdrift's tables",
         "".join(line for line in doc.splitlines(keepends=True)
                 if not line.startswith("| `--vocab-size")),
         "--vocab-size: printed by `cpdrift --help` but missing"),
        ("--seq-len removed from cpdrift's scope",
         replace_in_scope(doc, "cpdrift", "--seq-len", "the sequence length"),
         "--seq-len: printed by `cpdrift --help` but missing"),
        ("a made-up option in cpdrift's scope",
         append_to_scope(doc, "cpdrift", f"`{MADE_UP}` does what it says."),
         f"{MADE_UP}: named in scope 'cpdrift' but not printed"),
        ("a made-up option in the prose",
         doc.replace("\n", f"\nSee also `{MADE_UP}`.\n", 1),
         f"{MADE_UP}: named in cli.md but printed by no --help"),
        ("an off-help entry that --help prints",
         append_to_scope(doc, "cpdrift off-help", "| `--seed N` | `run` | stale |"),
         "off-help --seed: cpdrift --help prints it now"),
        ("an off-help entry the program does not accept",
         append_to_scope(doc, "cpdrift off-help", f"| `{MADE_UP}` | `run` | invented |"),
         f"off-help {MADE_UP}: `cpdrift run` does not accept it"),
    ]
    if "cpdrift-inspect" in programs.helps:
        result += [
            ("--atol removed from diff's scope",
             replace_in_scope(doc, "cpdrift-inspect diff", "--atol", "a tolerance"),
             "--atol: printed by `cpdrift-inspect diff --help` but missing"),
            ("--json documented under export",
             append_to_scope(doc, "cpdrift-inspect export", "`--json` prints JSON."),
             "--json: named in scope 'cpdrift-inspect export' but not printed"),
            ("-o removed from plot's scope",
             replace_in_scope(doc, "cpdrift-inspect plot", "-o", "--output"),
             "-o: printed by `cpdrift-inspect plot --help` but missing"),
            ("the --case row removed from summary's table (its synopsis still names it)",
             doc.replace("| `--case NAME` | only this case (repeatable) |\n", "", 1),
             "--case: printed by `cpdrift-inspect summary --help` but has no row"),
            ("the list command's scope missing",
             doc.replace("<!-- cli-scope: cpdrift-inspect list -->",
                         "<!-- cli-scope: none -->"),
             "scope 'cpdrift-inspect list' is missing"),
        ]
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpdrift", required=True)
    ap.add_argument("--inspect")
    ap.add_argument("--root")
    ap.add_argument("--doc")
    ap.add_argument("--no-controls", action="store_true")
    args = ap.parse_args()
    if not args.doc and not args.root:
        ap.error("--root or --doc is required")
    path = args.doc or os.path.join(args.root, "docs", "cli.md")
    with open(path, encoding="utf-8") as f:
        doc = f.read()

    programs = Programs(args.cpdrift, args.inspect)
    checked = ", ".join(sorted(programs.helps))
    print(f"# scopes checked against --help: {checked}")
    if not args.inspect:
        print("# no --inspect: cpdrift-inspect's scopes are not checked (a build without HDF5)")
    # The probe itself must be able to say no.
    if not programs.refusal("run", MADE_UP):
        print(f"FAIL: the probe accepts {MADE_UP}: it cannot tell an unknown option")
        return 1

    errors = check(doc, programs)
    for e in errors:
        print(f"FAIL: {path}: {e}")
    if not errors:
        count = len(programs.all_printed)
        print(f"ok: {path} names every option --help prints ({count} long options) and no other")

    failed_controls = 0
    if not args.no_controls:
        for what, mutated, expected in controls(doc, programs):
            found = check(mutated, programs)
            if any(expected in e for e in found):
                print(f"ok: control refused: {what}")
            else:
                failed_controls += 1
                print(f"FAIL: control passed: {what} (expected '{expected}'; got {found})")
    return 1 if errors or failed_controls else 0


if __name__ == "__main__":
    sys.exit(main())
