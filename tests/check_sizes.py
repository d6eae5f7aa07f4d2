#!/usr/bin/env python3
"""Checks the size limits of the sources (*.h *.cpp *.cu *.cuh under src/ and include/):

- no file over 450 lines;
- no function over 100 lines, counted from the first line of its signature to its closing
  brace. A function is a `{` at namespace or class scope whose text before it ends in `)` (plus
  qualifiers such as const, override, noexcept, a trailing `-> type`) or in a constructor's
  initializer list; lambdas and blocks inside a function count toward that function. Braces in
  comments, strings, character literals and preprocessor lines are not counted.

Each finding is one line, `path:line: ...`. tests/size_exceptions.txt lists what may still be
over for now (`path` for a file's length, `path:function` for a function, each with a reason);
an entry that no longer matches a finding is an error too, so the list can only shrink.

Before the tree, the self-test (the negative control): synthetic files, in a temporary
directory, of 451 lines, with a function of 101 lines, each of which must be reported, and one
of 100 lines, a constructor with brace initializers and braces in strings and comments, none of
which may be.

Usage: check_sizes.py [--root REPO] [--exceptions FILE] [--self-test]
"""

import argparse
import re
import sys
import tempfile
from pathlib import Path

MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 100
SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}
FOLDERS = ("src", "include")

# What may follow a function's parameter list before its body.
QUALIFIERS = re.compile(
    r"(?:\s*(?:const|volatile|override|final|mutable|noexcept(?:\s*\([^()]*\))?|&&|&))*"
    r"(?:\s*->[^;{}()]*(?:\([^()]*\)[^;{}()]*)*)?\s*$")
# A constructor's initializer list: `) :` (not `::`) after the parameter list.
INIT_LIST = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)")
SCOPE_KEYWORD = re.compile(r"\b(?:namespace|extern|class|struct|union|enum)\b")
ACCESS_LABEL = re.compile(r"^\s*(?:public|private|protected)\s*:")


def blank_code(text):
    """The text with comments, string and character literals and preprocessor lines replaced by
    spaces (newlines kept), so that what remains is code whose braces count."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            blank(i, j)
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == '"':
            raw = re.search(r'(?:\bu8|\b[uUL])?R$', text[max(0, i - 3):i])
            if raw:
                m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
                end = text.find(")" + m.group(1) + '"', i) if m else -1
                j = n if end < 0 else end + len(m.group(1)) + 2
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                j += 1
            blank(i + 1, j - 1)
            i = j
        elif c == "'":
            token = re.search(r"[\w.']*$", text[:i]).group(0)
            if token[:1].isdigit():  # a digit separator, 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def function_name(head):
    """The name before the parameter list of a function's head."""
    m = INIT_LIST.search(head)
    end = m.start() + 1 if m else len(QUALIFIERS.sub("", head).rstrip())
    # The qualifiers removed, the head ends with the parameter list's `)`: find its `(`.
    stripped = head[:end].rstrip()
    depth = 0
    for k in range(len(stripped) - 1, -1, -1):
        if stripped[k] == ")":
            depth += 1
        elif stripped[k] == "(":
            depth -= 1
            if depth == 0:
                before = stripped[:k].rstrip()
                name = re.search(r"(operator\s*\S+?|~?[\w:]*\w)\s*$", before)
                if before.endswith("]") and not re.search(r"operator\s*\[\]$", before):  # a lambda at namespace scope: its variable
                    var = re.search(r"(\w+)\s*=\s*\[[^\]]*\]\s*$", before)
                    return var.group(1) if var else "<lambda>"
                return name.group(1) if name else "<unnamed>"
    return "<unnamed>"


def is_function_head(head):
    """Whether the code before a `{` at namespace or class scope makes the brace a function's
    body."""
    h = head.rstrip()
    if INIT_LIST.search(h):
        return h.endswith(")") or h.endswith("}")
    return QUALIFIERS.sub("", h).rstrip().endswith(")") and not h.endswith("=")


def in_head(head):
    """Whether a `{` at this point belongs to the declaration it stands in: a default argument
    or brace initializer inside the parameter list (`int n = T{1})`), or a member's brace
    initializer in a constructor's initializer list (`Foo() : a_{1}, b_{2} {`)."""
    h = head.rstrip()
    if h.count("(") > h.count(")"):
        return True
    return bool(INIT_LIST.search(h)) and bool(re.search(r"[\w>]$", h))


def find_functions(text):
    """(name, first line, last line) of each function definition in the text; raises ValueError
    where the braces do not balance."""
    code = blank_code(text)
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    line_of[len(code)] = line

    functions = []
    # 'scope' (namespace, class), 'function', 'data' (an initializer at scope level), 'head' (a
    # brace inside a declaration's head), 'inner' (any brace inside one of those).
    stack = []
    head_start = 0  # where the text before the next `{` at scope level starts
    for k, ch in enumerate(code):
        if ch == "{":
            if stack and stack[-1][0] in ("function", "inner", "data", "head"):
                stack.append(("inner", None))
                continue
            head = code[head_start:k]
            if in_head(head):
                stack.append(("head", None))
            elif is_function_head(head):
                start = head_start
                while code[start].isspace():
                    start += 1
                label = ACCESS_LABEL.match(code[start:k])
                if label:
                    start += label.end()
                    while code[start].isspace():
                        start += 1
                stack.append(("function", (function_name(head), line_of[start])))
            elif SCOPE_KEYWORD.search(head) and "=" not in head:
                stack.append(("scope", None))
                head_start = k + 1
            else:
                stack.append(("data", None))
        elif ch == "}":
            if not stack:
                raise ValueError(f"line {line_of[k]}: unbalanced `}}`")
            kind, info = stack.pop()
            if kind == "function":
                functions.append((info[0], info[1], line_of[k]))
            if kind in ("function", "scope", "data"):
                head_start = k + 1
        elif ch == ";" and (not stack or stack[-1][0] == "scope"):
            head_start = k + 1
    if stack:
        raise ValueError("unbalanced `{` at the end of the file")
    return functions


def findings(root):
    """(path, function or None, message) of each file and function over its limit."""
    out = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8")
            lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            if lines > MAX_FILE_LINES:
                out.append((rel, None, f"{rel}:1: {lines} lines (at most {MAX_FILE_LINES})"))
            try:
                functions = find_functions(text)
            except ValueError as e:
                out.append((rel, "<braces>", f"{rel}: {e}"))
                continue
            for name, first, last in functions:
                length = last - first + 1
                if length > MAX_FUNCTION_LINES:
                    out.append((rel, name, f"{rel}:{first}: function {name} has {length} lines "
                                f"(at most {MAX_FUNCTION_LINES})"))
    return out


def read_exceptions(path):
    """{(path, function or None): line number} from the allow-list; raises ValueError for an
    entry without a reason."""
    entries = {}
    if not path.exists():
        return entries
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) < 2:
            raise ValueError(f"{path.name}:{number}: `{parts[0]}` has no reason")
        rel, _, function = parts[0].partition(":")
        entries[(rel, function or None)] = number
    return entries


def check(root, exceptions_path):
    """The error lines for the tree at root against the allow-list."""
    try:
        allowed = read_exceptions(exceptions_path)
    except ValueError as e:
        return [str(e)]
    errors, used = [], set()
    for rel, function, message in findings(root):
        key = (rel, function)
        if key in allowed:
            used.add(key)
        else:
            errors.append(message)
    for key, number in sorted(allowed.items(), key=lambda kv: kv[1]):
        if key not in used:
            what = key[0] + (":" + key[1] if key[1] else "")
            errors.append(f"{exceptions_path.name}:{number}: `{what}` is within the limits now; "
                          "remove the entry")
    return errors


def function_text(name, lines, signature=None):
    """A function of exactly `lines` lines, with a lambda, braces in strings, characters and
    comments, and a nested block inside."""
    body = [f"  auto f = [](int x) {{ return x + '{{'; }};  // }} {{",
            '  const char* s = "}}}{";',
            "  /* { */ if (f(1)) {",
            "  }"]
    filler = lines - 3 - len(body)
    return ([signature or f"int {name}(int a) {{"] + body
            + [f"  a += {k}'000;" for k in range(filler)] + ["  return a;", "}"])


def self_test():
    """The negative control; returns the error lines (empty when the checker behaves)."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "src" / "x").mkdir(parents=True)
        (root / "include").mkdir()
        big = ["namespace a {"] + function_text("too_long", 101) + \
              ["struct S {", "  S() : a_{1}, b_(2) {", "  }",
               "  int a_{0};", "  int b_ = 0;"] + \
              ["  " + line for line in function_text("member", 101,
                                                     "int member(int a) const noexcept {")] + \
              ["};", "}  // namespace a"]
        big += ["// filler"] * (451 - len(big))
        (root / "src" / "x" / "big.cpp").write_text("\n".join(big) + "\n")
        ok = ["namespace b {", 'extern "C" {', "}"] + function_text("just_fits", 100) + \
             ["auto g() -> int {", "  return 0;", "}",
              "int h(int a, F f = {},", "      int b = int{2}) {", "  return a;", "}",
              "struct T : U {", "  T() : U{3} {", "  }", "  int& operator[](int i) { return v[i]; }",
              "};", "}"]
        (root / "include" / "ok.h").write_text("\n".join(ok) + "\n")

        exceptions = root / "size_exceptions.txt"
        got = check(root, exceptions)
        expected = ["src/x/big.cpp:1: 451 lines",
                    "src/x/big.cpp:2: function too_long has 101 lines",
                    "function member has 101 lines"]
        for want in expected:
            if not any(want in line for line in got):
                problems.append(f"self-test: `{want}` not reported (got {got})")
        if len(got) != len(expected):
            problems.append(f"self-test: expected {len(expected)} findings, got {got}")
        found = {name for name, _, _ in find_functions("\n".join(ok))}
        if found != {"just_fits", "g", "h", "T", "operator[]"}:
            problems.append(f"self-test: functions of ok.h found as {sorted(found)}")

        exceptions.write_text("src/x/big.cpp  synthetic\nsrc/x/big.cpp:too_long  synthetic\n"
                              "src/x/big.cpp:member  synthetic\nsrc/x/ok.cpp  stale\n")
        got = check(root, exceptions)
        if len(got) != 1 or "`src/x/ok.cpp` is within the limits now" not in got[0]:
            problems.append(f"self-test: the stale allow-list entry not refused alone: {got}")
        exceptions.write_text("src/x/big.cpp\n")
        got = check(root, exceptions)
        if len(got) != 1 or "has no reason" not in got[0]:
            problems.append(f"self-test: an entry without a reason not refused: {got}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repo = Path(__file__).resolve().parent.parent
    parser.add_argument("--root", type=Path, default=repo)
    parser.add_argument("--exceptions", type=Path)
    parser.add_argument("--self-test", action="store_true", help="only the negative control")
    args = parser.parse_args()

    errors = self_test()
    if not args.self_test and not errors:
        exceptions = args.exceptions or args.root / "tests" / "size_exceptions.txt"
        errors = check(args.root, exceptions)
    for line in errors:
        print(line)
    if errors:
        print(f"check_sizes: {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print("check_sizes: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
