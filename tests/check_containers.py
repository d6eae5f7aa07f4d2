#!/usr/bin/env python3
"""Checks the container files, which cannot be built here (no container engine), for what can be
checked without building them:

- containers/versions.env is the one list of pins; every ARG default of containers/Dockerfile
  and every pin variable of containers/cpdrift.def names exactly its value, and both base
  images of both files are the ones it names;
- each base image is pinned to an exact tag (no `latest`, no floating `13` or `13.0`);
- each file has exactly two stages, `build` then `run`;
- the pinned packages (NCCL, HDF5, Meson, RapidJSON, doctest, nettle, OpenBLAS) are installed at
  their pinned versions, and Open MPI comes from its pinned tarball, SHA-256 checked, configured
  with --with-cuda and --with-pmix;
- the run stage starts from a runtime image, installs no compiler (gcc, g++, clang, nvcc, CUDA
  toolkits, any -dev package), copies or installs no libcuda (nor the driver stub), and runs
  containers/check-image.sh run;
- the CPU suite runs: in the Dockerfile's run stage as a RUN step, and as the def's %test, each
  with `meson test` and the MPI root variables, not masked.

Then the negative control: mutated copies of the three files, in a temporary directory, each of
which must be refused for the reason it was made to break.

Usage: check_containers.py [--root REPO] [--no-control]
"""

import argparse
import re
import sys
import tempfile
from pathlib import Path

from container_files import apt_packages, expand, parse_def, parse_dockerfile, read_versions

DOCKERFILE = "containers/Dockerfile"
DEFFILE = "containers/cpdrift.def"
VERSIONS = "containers/versions.env"

# Pins that the def carries in its From lines instead of variables.
IMAGE_PINS = ("UBUNTU_VERSION", "CUDA_VERSION")
# Every package the build names, and the pin its version must be.
PINNED_PACKAGES = {
    "libnccl2": "NCCL_VERSION",
    "libnccl-dev": "NCCL_VERSION",
    "meson": "MESON_VERSION",
    "rapidjson-dev": "RAPIDJSON_VERSION",
    "doctest-dev": "DOCTEST_VERSION",
    "nettle-dev": "NETTLE_VERSION",
    "libnettle8t64": "NETTLE_VERSION",
    "libopenblas0-pthread": "OPENBLAS_VERSION",
}
PINNED_PATTERNS = [(re.compile(r"^libhdf5-"), "HDF5_VERSION")]
# What the build stage must install (pinned), so that every named version is one of the pins.
BUILD_NEEDS = ["libnccl-dev", "libhdf5-dev", "meson", "rapidjson-dev", "doctest-dev", "nettle-dev"]
RUN_NEEDS = ["libnccl2"]

COMPILER = re.compile(
    r"^(gcc|g\+\+|cpp|c\+\+|clang|clang\+\+|llvm|gfortran|build-essential|nvidia-cuda-toolkit)"
    r"(-[0-9.]+)?$|^cuda-(nvcc|toolkit|minimal-build|libraries-dev|compiler|crt|cudart-dev)"
    r"|-dev$|-devel$|^libstdc\+\+-[0-9]+-dev$")
DRIVER = re.compile(
    r"^(libcuda1|cuda-drivers|cuda-compat|nvidia-driver|libnvidia-compute|nvidia-utils)")
LIBCUDA = re.compile(r"libcuda|/stubs\b|/usr/local/cuda")
MASKED = re.compile(r"\|\|\s*(true|:|exit\s+0)\b|;\s*(true|:)\s*$")


def used_pins(text, pins):
    """The pins `text` expands, as ${NAME} or $NAME."""
    found = re.findall(r"\$\{([A-Z][A-Z0-9_]*)\}|\$([A-Z][A-Z0-9_]*)", text)
    return {braced or bare for braced, bare in found} & set(pins)


# ---------------------------------------------------------------------------------------------
# Checks


def exact_tag_problem(image):
    """Why `image` is not pinned to an exact tag, or None."""
    if "@sha256:" in image:
        return None
    ref = image.rsplit("/", 1)[-1]
    if ":" not in ref:
        return "has no tag (that is `latest`)"
    tag = ref.split(":", 1)[1]
    if tag == "latest" or tag.startswith("latest"):
        return "is tagged latest"
    if "$" in tag:
        return "has a tag that no pin resolves"
    if not re.match(r"^v?\d+\.\d+\.\d+(?![.\d])", tag):
        return f"has the floating tag {tag!r} (needs an exact MAJOR.MINOR.PATCH version)"
    return None


def check_file(label, stages, pins, errors, expected_images):
    names = [s.name for s in stages]
    if names != ["build", "run"]:
        errors.append(f"{label}: has the stages {names}, not exactly ['build', 'run']")
    for stage in stages:
        where = f"{label}: stage {stage.name!r}"
        problem = exact_tag_problem(stage.image)
        if problem:
            errors.append(f"{where}: base image {stage.image!r} is not pinned: it {problem}")
        expected = expected_images.get(stage.name)
        if expected and stage.image != expected:
            errors.append(f"{where}: base image {stage.image!r}, but versions.env makes it "
                          f"{expected!r}")
        # Pins: what the stage writes must be the pin, and what it expands it must define.
        for name, value in stage.assigned:
            if name in pins and value != pins[name]:
                errors.append(f"{where}: names {name}={value}, versions.env {name}={pins[name]}")
        text = "\n".join(stage.commands + stage.environment + ([stage.test] if stage.test else []))
        for name in sorted(used_pins(text, pins)):
            if name not in stage.defined:
                errors.append(f"{where}: expands ${{{name}}} without defining it there (ARG "
                              f"{name} in a Dockerfile stage): it would be empty")
        # Packages.
        installed = []
        for command in stage.commands:
            for spec in apt_packages(command):
                name, _, version = spec.partition("=")
                name = expand(name, stage.defined)
                installed.append(name)
                pin = PINNED_PACKAGES.get(name) or next(
                    (p for rx, p in PINNED_PATTERNS if rx.search(name)), None)
                if pin is None:
                    continue
                if not version:
                    errors.append(f"{where}: installs {name} without a version: it must be "
                                  f"pinned to ${{{pin}}}")
                    continue
                value = expand(version, stage.defined)
                if value != pins.get(pin):
                    errors.append(f"{where}: installs {name}={value}, but versions.env "
                                  f"{pin}={pins.get(pin)}")
        needs = BUILD_NEEDS if stage.name == "build" else RUN_NEEDS if stage.name == "run" else []
        for name in needs:
            if name not in installed:
                errors.append(f"{where}: does not install {name} (pinned)")
        if stage.name == "build":
            check_openmpi(where, "\n".join(stage.commands), errors)
        if stage.name == "run":
            check_run_stage(where, stage, installed, errors)


def check_openmpi(where, text, errors):
    if not re.search(r"openmpi-\$\{?OPENMPI_VERSION\}?\.tar", text):
        errors.append(f"{where}: does not download Open MPI's openmpi-${{OPENMPI_VERSION}} "
                      "release tarball")
    if not re.search(r"\$\{?OPENMPI_SHA256\}?.*\|\s*sha256sum\s+(--check|-c)", text):
        errors.append(f"{where}: does not check the Open MPI tarball's SHA-256 "
                      "(${OPENMPI_SHA256} | sha256sum --check)")
    configure = re.search(r"\./configure\b[^\n]*", text)
    for flag in ("--with-cuda", "--with-pmix"):
        if not configure or flag not in configure.group(0):
            errors.append(f"{where}: Open MPI is not configured {flag}")


def check_run_stage(where, stage, installed, errors):
    if re.search(r"[-:]devel\b|-devel-", stage.image):
        errors.append(f"{where}: starts from the devel image {stage.image!r}, which has the "
                      "compiler; the run stage starts from a runtime image")
    for name in installed:
        if COMPILER.search(name):
            errors.append(f"{where}: installs a compiler or development package: {name}")
        if DRIVER.search(name):
            errors.append(f"{where}: installs the driver package {name}: libcuda comes from the "
                          "host")
    for source in stage.copies:
        if LIBCUDA.search(source):
            errors.append(f"{where}: copies {source!r}: no libcuda, driver stub or CUDA toolkit "
                          "tree may enter the run stage")
    for env in stage.environment:
        if "stubs" in env:
            errors.append(f"{where}: its environment points at the CUDA driver stub: {env!r}")
    text = "\n".join(stage.commands)
    for m in re.finditer(r"\b(cp|ln|mv|install|curl|wget)\b[^\n;&|]*libcuda", text):
        errors.append(f"{where}: puts a libcuda in the image: {m.group(0)!r}")
    if "check-image.sh run" not in text:
        errors.append(f"{where}: does not run containers/check-image.sh run (no libcuda, every "
                      "library resolves)")


def check_suite(where, text, errors):
    """`text` must run the CPU suite with `meson test` and the MPI root variables."""
    if text is None:
        errors.append(f"{where}: has no step that runs the test suite")
        return
    lines = [l for l in text.splitlines() if re.search(r"\bmeson\s+test\b", l)]
    if not lines:
        errors.append(f"{where}: does not run the test suite (`meson test`)")
        return
    for line in lines:
        if " -C " not in f" {line} " and "-C/" not in line:
            errors.append(f"{where}: `meson test` without -C BUILDDIR: {line.strip()!r}")
        if MASKED.search(line[line.find("meson"):]):
            errors.append(f"{where}: the suite's failure is masked: {line.strip()!r}")
        suites = re.findall(r"--suite[= ](\S+)", line)
        if suites and "unit" not in suites:
            errors.append(f"{where}: `meson test` runs only the suites {suites}, not the CPU "
                          "suite")
    for var in ("OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"):
        if var not in text:
            errors.append(f"{where}: the suite runs without {var} (the MPI root variables)")


def check(root):
    """Every problem of the container files under `root`, as messages; [] when they pass."""
    root = Path(root)
    errors = []
    try:
        pins = read_versions(root / VERSIONS)
    except (OSError, ValueError) as e:
        return [str(e)]
    missing = [k for k in ("UBUNTU_VERSION", "CUDA_VERSION", "NCCL_VERSION", "OPENMPI_VERSION",
                           "OPENMPI_SHA256", "HDF5_VERSION", "MESON_VERSION", "RAPIDJSON_VERSION",
                           "DOCTEST_VERSION") if k not in pins]
    if missing:
        errors.append(f"{VERSIONS}: lacks the pins {missing}")
    if not re.fullmatch(r"[0-9a-f]{64}", pins.get("OPENMPI_SHA256", "")):
        errors.append(f"{VERSIONS}: OPENMPI_SHA256 is not a SHA-256 (64 hex digits)")
    cuda, ubuntu = pins.get("CUDA_VERSION", "?"), pins.get("UBUNTU_VERSION", "?")
    expected_images = {"build": f"nvidia/cuda:{cuda}-devel-ubuntu{ubuntu}",
                       "run": f"nvidia/cuda:{cuda}-runtime-ubuntu{ubuntu}"}

    # The Dockerfile: global ARG defaults are its pins.
    try:
        global_assigned, docker_stages = parse_dockerfile((root / DOCKERFILE).read_text())
    except OSError as e:
        return errors + [str(e)]
    for name, value in global_assigned:
        if name in pins and value != pins[name]:
            errors.append(f"{DOCKERFILE}: ARG {name}={value}, but versions.env {name}={pins[name]}")
    docker_named = {n for n, _ in global_assigned} | {
        n for s in docker_stages for n, _ in s.assigned}
    for name in sorted(set(pins) - docker_named):
        errors.append(f"{DOCKERFILE}: has no ARG {name} (versions.env pins it)")
    check_file(DOCKERFILE, docker_stages, pins, errors, expected_images)
    run = next((s for s in docker_stages if s.name == "run"), None)
    check_suite(f"{DOCKERFILE}: stage 'run'",
                "\n".join(c for c in run.commands if "meson test" in c) if run else None, errors)

    # The Apptainer definition: %post variables are its pins, the From lines carry the image's.
    try:
        def_stages = parse_def((root / DEFFILE).read_text())
    except OSError as e:
        return errors + [str(e)]
    def_named = {n for s in def_stages for n, _ in s.assigned} | set(IMAGE_PINS)
    for name in sorted(set(pins) - def_named):
        errors.append(f"{DEFFILE}: does not name {name} (versions.env pins it)")
    check_file(DEFFILE, def_stages, pins, errors, expected_images)
    final = def_stages[-1] if def_stages else None
    check_suite(f"{DEFFILE}: %test", final.test if final else None, errors)

    # The two files against each other (a clearer message when only one of them moved).
    docker_values = dict(global_assigned)
    for s in docker_stages:
        docker_values.update(s.assigned)
    def_values = {}
    for s in def_stages:
        def_values.update(s.assigned)
    for name in sorted(set(docker_values) & set(def_values) & set(pins)):
        if docker_values[name] != def_values[name]:
            errors.append(f"{DOCKERFILE} names {name}={docker_values[name]} but {DEFFILE} names "
                          f"{name}={def_values[name]}")
    for d, a in zip(docker_stages, def_stages):
        if d.image != a.image:
            errors.append(f"stage {d.name!r}: {DOCKERFILE} starts from {d.image!r}, {DEFFILE} "
                          f"from {a.image!r}")
    return errors


# ---------------------------------------------------------------------------------------------
# Negative control: each mutation must be refused, for its reason.


def replace(text, old, new, nth=1):
    """`text` with the nth occurrence of `old` replaced; raises when there is none."""
    at = -1
    for _ in range(nth):
        at = text.find(old, at + 1)
        if at < 0:
            raise LookupError(f"{old!r} (occurrence {nth}) not found")
    return text[:at] + new + text[at + len(old):]


MUTATIONS = [
    ("the Dockerfile's run image floats to latest", DOCKERFILE,
     lambda t: replace(t, "FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS run",
                       "FROM nvidia/cuda:latest AS run"), "is tagged latest"),
    ("the def's build image floats on the major version", DEFFILE,
     lambda t: re.sub(r"From: nvidia/cuda:[0-9.]+-devel", "From: nvidia/cuda:13-devel", t),
     "floating tag"),
    ("the Dockerfile gains a third stage", DOCKERFILE,
     lambda t: t + "\nFROM nvidia/cuda:13.0.2-base-ubuntu24.04 AS extra\n",
     "not exactly ['build', 'run']"),
    ("the def's stages are renamed", DEFFILE,
     lambda t: replace(t, "Stage: run", "Stage: final"), "not exactly ['build', 'run']"),
    ("the Dockerfile's run stage installs g++", DOCKERFILE,
     lambda t: replace(t, '"libopenblas0-pthread=${OPENBLAS_VERSION}" \\',
                       '"libopenblas0-pthread=${OPENBLAS_VERSION}" g++ \\'),
     "installs a compiler"),
    ("the def's run stage installs nvcc", DEFFILE,
     lambda t: replace(t, '"libopenblas0-pthread=${OPENBLAS_VERSION}" \\',
                       '"libopenblas0-pthread=${OPENBLAS_VERSION}" cuda-nvcc-13-0 \\'),
     "installs a compiler"),
    ("the Dockerfile's run stage starts from the devel image", DOCKERFILE,
     lambda t: replace(t, "-runtime-ubuntu${UBUNTU_VERSION} AS run",
                       "-devel-ubuntu${UBUNTU_VERSION} AS run"), "starts from the devel image"),
    ("the Dockerfile's run stage copies the driver stub", DOCKERFILE,
     lambda t: replace(t, "COPY --from=build /opt/cpdrift /opt/cpdrift",
                       "COPY --from=build /opt/cpdrift /opt/cpdrift\nCOPY --from=build "
                       "/usr/local/cuda/lib64/stubs/libcuda.so /usr/lib/x86_64-linux-gnu/"
                       "libcuda.so.1"), "no libcuda"),
    ("the def's run stage installs a driver package", DEFFILE,
     lambda t: replace(t, '"meson=${MESON_VERSION}"\n    compat',
                       '"meson=${MESON_VERSION}" libnvidia-compute-580\n    compat'),
     "driver package"),
    ("the def names another NCCL", DEFFILE,
     lambda t: replace(t, "NCCL_VERSION=2.", "NCCL_VERSION=1."), "NCCL_VERSION"),
    ("the Dockerfile names another Open MPI", DOCKERFILE,
     lambda t: re.sub(r"ARG OPENMPI_VERSION=\S+", "ARG OPENMPI_VERSION=4.1.6", t),
     "OPENMPI_VERSION"),
    ("versions.env moves CUDA alone", VERSIONS,
     lambda t: re.sub(r"CUDA_VERSION=\S+", "CUDA_VERSION=13.1.0", t), "CUDA_VERSION"),
    ("the Dockerfile installs meson unpinned", DOCKERFILE,
     lambda t: replace(t, '"meson=${MESON_VERSION}"', "meson"), "without a version"),
    ("the Open MPI tarball's checksum is not checked", DOCKERFILE,
     lambda t: replace(t, "sha256sum --check --strict", "cat"), "SHA-256"),
    ("Open MPI without PMIx", DEFFILE,
     lambda t: replace(t, "--with-pmix=internal ", ""), "--with-pmix"),
    ("a run stage that forgets ARG NCCL_VERSION", DOCKERFILE,
     lambda t: replace(t, "ARG NCCL_VERSION\n", "", nth=2), "without defining it"),
    ("%test does not run the suite", DEFFILE,
     lambda t: re.sub(r"(%test\n(?:.*\n)*?)\s*meson test[^\n]*\n", r"\1    echo skipped\n", t),
     "does not run the test suite"),
    ("%test without the MPI root variables", DEFFILE,
     lambda t: replace(t, "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n",
                       "", nth=1), "MPI root variables"),
    ("the Dockerfile's suite is masked", DOCKERFILE,
     lambda t: replace(t, "--no-suite gpu --print-errorlogs", "--no-suite gpu --print-errorlogs "
                       "|| true"), "masked"),
]


def negative_control(root):
    """Messages for every mutation that was not refused for its reason; [] when all were."""
    root = Path(root)
    originals = {f: (root / f).read_text() for f in (DOCKERFILE, DEFFILE, VERSIONS)}
    problems = []
    for what, target, mutate, reason in MUTATIONS:
        try:
            mutated = mutate(originals[target])
        except LookupError as e:
            problems.append(f"control {what!r}: the mutation no longer applies: {e}")
            continue
        if mutated == originals[target]:
            problems.append(f"control {what!r}: the mutation changed nothing")
            continue
        with tempfile.TemporaryDirectory(prefix="check_containers.") as tmp:
            (Path(tmp) / "containers").mkdir()
            for f, text in originals.items():
                (Path(tmp) / f).write_text(mutated if f == target else text)
            errors = check(tmp)
        if not errors:
            problems.append(f"control {what!r}: accepted, but must be refused")
        elif not any(reason in e for e in errors):
            problems.append(f"control {what!r}: refused, but not for {reason!r}: {errors}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=Path(__file__).resolve().parent.parent,
                        help="the repository root (default: this file's ../)")
    parser.add_argument("--no-control", action="store_true",
                        help="check the files only, without the negative control")
    args = parser.parse_args()
    errors = check(args.root)
    for e in errors:
        print(f"FAIL {e}")
    if not errors:
        print(f"ok   {DOCKERFILE}, {DEFFILE} and {VERSIONS} agree: pins, stages, run stage, suite")
    problems = [] if args.no_control else negative_control(args.root)
    for p in problems:
        print(f"FAIL {p}")
    if not args.no_control and not problems:
        print(f"ok   negative control: {len(MUTATIONS)} mutated copies, each refused for its reason")
    return 1 if errors or problems else 0


if __name__ == "__main__":
    sys.exit(main())
