#!/usr/bin/env bash
# A workstation, no Slurm: TP=2 x CP=2 on 4 processes under a plain mpirun -- one process per
# GPU with NCCL when the machine has 4 GPUs, else the CPU backend (4 processes sharing the
# cores). The same cases as jobs/cpdrift-tp2cp2.sbatch at a workstation's size.
#   jobs/cpdrift-workstation.sh [more cpdrift options, given last]
# Settings (environment):
#   CPDRIFT_BIN        the binary (default: build/cpdrift of this checkout)
#   CPDRIFT_DEVICE     cuda | cpu (default: cuda when nvidia-smi lists 4 GPUs or more, else cpu)
#   CPDRIFT_OUTDIR     where the report goes (default: the current directory)
#   CPDRIFT_SEQ_LEN    --seq-len (default 4096 on GPUs, 1024 on the CPU)
#   CPDRIFT_KV_CHUNK_SIZES  --kv-chunk-sizes (default none,256)
# Writes cpdrift-workstation-<UTC time>.json; the NCCL knobs are jobs/lib/cpdrift-job.sh's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=jobs/lib/cpdrift-job.sh
source "$root/jobs/lib/cpdrift-job.sh"  # for cpdrift_nccl_env only

bin=${CPDRIFT_BIN:-$root/build/cpdrift}
outdir=${CPDRIFT_OUTDIR:-$PWD}
np=4
gpus=0
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
device=${CPDRIFT_DEVICE:-$( ((gpus >= np)) && echo cuda || echo cpu)}
mpirun_args=(-np "$np")
((EUID == 0)) && mpirun_args+=(--allow-run-as-root)  # Open MPI refuses root unless told (containers)
case $device in
  cuda)
    device_args=(--device cuda --transport nccl)
    seq_len=${CPDRIFT_SEQ_LEN:-4096}
    cpdrift_nccl_env
    echo "# NCCL: ${cpdrift_nccl_shown[*]}"
    ;;
  cpu)
    device_args=(--device cpu --transport mpi)
    seq_len=${CPDRIFT_SEQ_LEN:-1024}
    mpirun_args+=(--oversubscribe)  # 4 processes may outnumber the cores
    ;;
  *) echo "${0##*/}: CPDRIFT_DEVICE=$device: expected cuda or cpu" >&2; exit 2 ;;
esac
[[ -x $bin ]] || { echo "${0##*/}: $bin is not an executable (build it, or set CPDRIFT_BIN)" >&2; exit 2; }
mkdir -p "$outdir"
report=$outdir/cpdrift-workstation-$(date -u +%Y%m%dT%H%M%SZ).json

# shellcheck disable=SC2054  # the commas are cpdrift's list syntax
run=(mpirun "${mpirun_args[@]}" "$bin" "${device_args[@]}"
  --tp-world-sizes 2 --cp-world-sizes 2
  --seq-len "$seq_len" --kv-chunk-sizes "${CPDRIFT_KV_CHUNK_SIZES:-none,256}"
  --cp-layouts contiguous,zigzag --protocols ag_rs,ring_kv --include-backward --include-dlogp
  --output "$report" "$@")
echo "# ${run[*]}"
exec "${run[@]}"
