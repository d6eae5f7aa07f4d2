"""The container files as check_containers.py reads them: containers/versions.env's pins, the
Dockerfile's and the Apptainer def's stages (base image, variables, commands), and the packages a
command installs with apt."""

import re
import shlex


class Stage:
    """One stage of either file, reduced to what the checks read."""

    def __init__(self, name, image):
        self.name = name
        self.image = image          # resolved reference
        self.defined = {}           # pin name -> value this stage can expand
        self.assigned = []          # (pin name, value) written in this stage
        self.commands = []          # shell text run while building (RUN / %post)
        self.copies = []            # sources copied in (COPY/ADD / %files)
        self.environment = []       # ENV / %environment text
        self.test = None            # the def's %test text


# ---------------------------------------------------------------------------------------------
# Parsing


def read_versions(path):
    pins = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S+)", line)
        if not m:
            raise ValueError(f"{VERSIONS}:{n}: not KEY=VALUE: {line!r}")
        pins[m.group(1)] = m.group(2)
    return pins


def expand(text, values):
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)",
                  lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def dockerfile_instructions(text):
    """(keyword, arguments) per instruction: continuations joined, comments dropped."""
    out = []
    for line in shell_text(text.splitlines()):
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def parse_dockerfile(text):
    """(global ARG defaults as (name, value) pairs, stages)."""
    global_args, global_assigned, stages = {}, [], []
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            image = expand(words[0], global_args) if words else ""
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name, image))
        elif keyword == "ARG":
            name, eq, value = rest.partition("=")
            name, value = name.strip(), value.strip()
            if not stages:
                global_args[name] = value
                if eq:
                    global_assigned.append((name, value))
            elif eq:
                stages[-1].defined[name] = value
                stages[-1].assigned.append((name, value))
            elif name in global_args:  # a stage's `ARG NAME` imports the global default
                stages[-1].defined[name] = global_args[name]
        elif not stages:
            continue
        elif keyword == "RUN":
            stages[-1].commands.append(rest)
        elif keyword in ("COPY", "ADD"):
            words = [w for w in rest.split() if not w.startswith("--")]
            stages[-1].copies.extend(words[:-1])
        elif keyword == "ENV":
            stages[-1].environment.append(rest)
    return global_assigned, stages


def def_sections(text):
    """The def's stages as (headers, [(section, args, body lines)])."""
    stages = []
    for line in text.splitlines():
        if re.match(r"^Bootstrap:", line):
            stages.append(({}, []))
        if not stages:
            continue
        headers, sections = stages[-1]
        m = re.match(r"^%(\w+)\s*(.*)$", line)
        if m:
            sections.append((m.group(1), m.group(2).strip(), []))
            continue
        h = re.match(r"^(\w+):\s*(.*)$", line)
        if h and not sections:
            headers[h.group(1)] = h.group(2).strip()
            continue
        if sections:
            sections[-1][2].append(line)
    return stages


def shell_text(lines):
    """Shell lines with comments dropped and continuations joined."""
    out, buf = [], ""
    for raw in lines:
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def parse_def(text):
    stages = []
    for headers, sections in def_sections(text):
        stage = Stage(headers.get("Stage"), headers.get("From", ""))
        for name, args, body in sections:
            if name == "post":
                lines = shell_text(body)
                stage.commands.append("\n".join(lines))
                for line in lines:
                    m = re.fullmatch(r"(?:export\s+)?([A-Z][A-Z0-9_]*)=(\S*)", line)
                    if m:
                        stage.defined[m.group(1)] = m.group(2)
                        stage.assigned.append((m.group(1), m.group(2)))
            elif name == "files":
                for line in shell_text(body):
                    stage.copies.append(line.split()[0])
                    if args:
                        stage.copies.append(f"{args}: {line}")
            elif name == "environment":
                stage.environment.extend(shell_text(body))
            elif name == "test":
                stage.test = "\n".join(shell_text(body))
        stages.append(stage)
    return stages


def apt_packages(command):
    """Every package spec an `apt-get install` / `apt install` in `command` names."""
    specs = []
    for m in re.finditer(r"\bapt(?:-get)?\s+install\b(.*?)(?=&&|;|\|\||\n|$)", command, re.S):
        try:
            words = shlex.split(m.group(1))
        except ValueError:
            words = m.group(1).split()
        specs.extend(w for w in words if not w.startswith("-"))
    return specs
