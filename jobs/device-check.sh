#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, nvcc, meson and ninja but possibly no Open
# MPI, no HDF5 and no network (docs/device.md). Builds the CUDA configuration (with MPI where the
# machine has it or .device/openmpi.tar.xz brings it, else the one-process build); runs the GPU
# suites (the multi-process one under mpirun), a --device cuda smoke, a TP=2 x CP=2 run whose
# FP32 path must match the CPU backend's bits, the paged (rollout) cases with every invariance
# bitwise, the benchmark, and last the unit and CLI suites; prints a pass/fail table and exits
# non-zero on any failure. Logs and reports go to $OUT (or build-device-logs/).
#   jobs/device-check.sh [--no-bench]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${CPDRIFT_DEVICE_BUILD:-build-device}
logdir=${OUT:-$build-logs}
mkdir -p "$logdir"
log=$logdir/device-check.log
: >"$log"
bench=1
[[ ${1:-} == --no-bench ]] && bench=0

names=() results=() seconds=()
step() {  # step NAME COMMAND...: runs it, appends its output to the log, records the verdict
  local name=$1 start end rc
  shift
  echo "=== $name: $*" >>"$log"
  start=$(date +%s.%N)
  "$@" >>"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  names+=("$name")
  results+=("$([[ $rc == 0 ]] && echo pass || echo "FAIL (rc $rc)")")
  seconds+=("$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')")
  echo "device-check: $name: ${results[-1]} (${seconds[-1]} s)"
  return $rc
}

extra=()
[[ -d .device/include ]] && extra=(-Dextra_include_dir=.device/include)
if [[ -d .device/lib/pkgconfig ]]; then  # nettle, carried by jobs/prepare-device.sh
  export PKG_CONFIG_PATH=$root/.device/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$root/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# pkg-config, carried, only where the machine has none.
if [[ -x .device/bin/pkg-config ]] && ! command -v pkg-config >/dev/null; then
  export PATH=$PATH:$root/.device/bin
fi
# Open MPI, carried, where the machine has no mpirun: unpacked into / without replacing a file.
mpi_setup() {
  if command -v mpirun >/dev/null; then
    echo "mpirun already here: $(command -v mpirun)"
  else
    tar -C / --skip-old-files -xJf .device/openmpi.tar.xz || return 1
    local t
    for t in mpirun mpiexec mpicc mpicxx mpic++; do
      [[ -e /usr/bin/$t ]] || ln -s "$t.openmpi" "/usr/bin/$t"
    done
    ldconfig
  fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Components whose libraries this machine lacks (InfiniBand, UCX, libfabric): no warning each.
  export OMPI_MCA_mca_base_component_show_load_errors=0
  mpirun --version && mpirun -np 2 --oversubscribe hostname
}
mpi=disabled
configure() {
  rm -rf "$build"
  meson setup "$build" -Dmpi=$mpi -Dhdf5=disabled -Dcuda=enabled -Dgpu_arch=90 "${extra[@]}"
}
# Meson's suite gpu: test_gpu (every CUDA kernel against the CPU backend) and, with MPI, the
# transports under mpirun -np 2. Meson counts a skip (exit 77) as a pass; here a GPU is present,
# so every test must pass but gpu_nccl_np2, which needs a GPU per process, on a one-GPU machine.
gpu_suite() {
  meson test -C "$build" --suite gpu --print-errorlogs
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  python3 - "$build/meson-logs/testlog.json" "$gpus" <<'PY'
import json, sys
log, gpus = sys.argv[1], int(sys.argv[2])
# The test's name as meson's version writes it: "gpu_nccl_np2", "cpdrift:gpu / gpu_nccl_np2"
# or (meson 1.12) "gpu - cpdrift:gpu_nccl_np2".
def bare(name):
    return name.rsplit(":", 1)[-1].split(" / ")[-1]
results = {bare(t["name"]): t["result"] for t in map(json.loads, open(log))}
allowed = {"gpu_nccl_np2"} if gpus < 2 else set()
bad = {n: r for n, r in results.items() if r != "OK" and not (r == "SKIP" and n in allowed)}
print(", ".join(f"{n}: {r}" for n, r in sorted(results.items())), f"({gpus} GPU)")
sys.exit(f"not passed: {bad}" if bad or not results else 0)
PY
}
json_check() {  # json_check FILE: every case has cuda_vs_cpu_fp32 available and bitwise equal
  python3 - "$1" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
assert report["runtime"]["device"].startswith("cuda"), report["runtime"]["device"]
cases = report["cases"]
for c in cases:
    g = c["cuda_vs_cpu_fp32"]
    assert g["status"] == "available" and g["bitwise_equal"], (c["case_name"], g)
print(f"{len(cases)} cases: cuda_vs_cpu_fp32 bitwise equal in every one")
PY
}
smoke() { "$build/cpdrift" --device cuda --smoke --json >"$logdir/smoke.json" && json_check "$logdir/smoke.json"; }
tp2cp2() {
  "$build/cpdrift" --device cuda --seq-len 2048 --tp-world-sizes 1,2 --cp-world-sizes 1,2 --kv-chunk-sizes none,256 \
    --include-backward --include-dlogp --output "$logdir/tp2cp2.json" && json_check "$logdir/tp2cp2.json"
}
paged() {  # the rollout side on the GPU: every invariance bitwise, paged drift within thresholds
  "$build/cpdrift" --device cuda --modes paged_prefill,decode --fixed-split-size 64 --seq-len 1024 --batch 4 \
    --output "$logdir/paged.json" &&
    python3 - "$logdir/paged.json" <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))["paged_cases"]
assert len(cases) == 4, len(cases)
for c in cases:
    for name, inv in c["paged"]["invariance"].items():
        assert inv["passed"], (c["case_name"], name)
print(f"{len(cases)} paged cases: every invariance bitwise")
PY
}

# One process: the GPU transports start, and a run through them gives the in-process run's
# digests. Every message stays in the process, so no byte crosses a GPU
# transport here; tests/test_gpu_transports.cpp and test_gpu_nccl.cpp under mpirun move data.
transports_init() {
  local t used=()
  for t in auto nccl cuda_ipc; do
    if ! "$build/cpdrift" --device cuda --transport "$t" --smoke --json >"$logdir/smoke_$t.json" \
      2>"$logdir/smoke_$t.err"; then
      cat "$logdir/smoke_$t.err"
      # A toolkit without libnccl builds without the NCCL transport: say so, check the rest.
      if [[ $t == nccl ]] && grep -q "built without NCCL" "$logdir/smoke_$t.err"; then
        no_nccl=1
        continue
      fi
      return 1
    fi
    used+=("$t")
  done
  python3 - "${used[@]/#/$logdir/smoke_}" <<'PY'
import json, sys
runs = [json.load(open(f + ".json")) for f in sys.argv[1:]]
def digests(r):
    return [(c["case_name"], c["drift"]["cp_merge_fp32"]["out"]["digest"], c["drift"]["bf16_kernel"]["out"]["digest"])
            for c in r["cases"]]
for r, f in zip(runs[1:], sys.argv[2:]):
    name = f.rsplit("smoke_", 1)[1]
    assert r["cases"][0]["topology"]["transport"] == name, r["cases"][0]["topology"]["transport"]
    assert digests(r) == digests(runs[0]), name
print(", ".join(f.rsplit("smoke_", 1)[1] for f in sys.argv[2:])
      + ": the same digests as the in-process run in every case")
PY
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$log" 2>&1
if command -v mpirun >/dev/null || [[ -f .device/openmpi.tar.xz ]]; then
  step mpi_setup mpi_setup && mpi=enabled
fi
step configure configure && step build ninja -C "$build" &&
  {
    step gpu_suite gpu_suite
    step smoke smoke
    step tp2cp2_vs_cpu tp2cp2
    step paged paged
    no_nccl=0
    step transports_init transports_init
    [[ $no_nccl == 1 && ${results[-1]} == pass ]] && results[-1]="pass, no NCCL"
    [[ $bench == 1 ]] && step bench "$build/cpdrift" bench --device cuda --repeats 5
    step unit_tests meson test -C "$build" --suite unit --suite cli --print-errorlogs
  }

echo
printf '| %-16s | %-12s | %9s |\n' step result seconds
printf '|%s|%s|%s|\n' ------------------ -------------- -----------
failed=0
for i in "${!names[@]}"; do
  printf '| %-16s | %-12s | %9s |\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}"
  [[ ${results[$i]} == pass* ]] || failed=1
done
if [[ $bench == 1 ]]; then
  echo
  sed -n '/=== bench/,$p' "$log" | grep -v '^===' || true
fi
echo "device-check: log in $log"
exit $failed
