# shellcheck shell=bash
# Sourced by the jobs/*.sbatch scripts, never run: the outside-Slurm guard, the settings every
# job reads from its environment, the NCCL knobs, and the launch of one cpdrift process per
# task through `srun --mpi=pmix` or Open MPI's `mpirun`. docs/slurm.md has the whole picture.
#
# Settings, read from the environment (sbatch hands the submitting shell's environment to the
# job: `CPDRIFT_DEVICE=cpu sbatch ...`); each script adds its own problem size:
#   CPDRIFT_ROOT      the cpdrift checkout (default: the directory sbatch was run in)
#   CPDRIFT_BIN       the binary (default: $CPDRIFT_ROOT/build/cpdrift)
#   CPDRIFT_DEVICE    cuda (default): --device cuda, one GPU per task; cpu: the CPU backend, for
#                     nodes without GPUs (submit with --gpus-per-node=0, docs/slurm.md)
#   CPDRIFT_TRANSPORT how partial states move (default: nccl on cuda, mpi on cpu; cuda_ipc)
#   CPDRIFT_LAUNCHER  srun (default: srun --mpi=pmix) or mpirun (Open MPI's, in the allocation)
#   CPDRIFT_OUTDIR    where the report (and dump) go (default: the job's working directory)
#   CPDRIFT_DUMP      1: also write the HDF5 dump of every compared tensor (default 0: large)
#   CPDRIFT_SEQ_LEN, CPDRIFT_KV_CHUNK_SIZES
#                     the run's --seq-len and --kv-chunk-sizes (defaults: the script's)
#   CPDRIFT_EXTRA_ARGS more cpdrift options, split on spaces, given last (so they override the
#                     script's: e.g. "--cp-layouts zigzag --comm-timeout 600")
# Every file a job writes is named <job name>-<job id>.<ext>, as is Slurm's own output.

# Refuses, with one line on stderr and status 2, to run outside a Slurm allocation: the
# scripts read the allocation's task counts and launch with srun.
cpdrift_require_slurm() {
  if [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "${0##*/}: not inside a Slurm job (SLURM_JOB_ID is unset): submit it with sbatch;" \
      "for a workstation use jobs/cpdrift-workstation.sh" >&2
    exit 2
  fi
}

# Reads and checks the settings above; sets cpdrift_device_args (the device and transport
# options of a run) and cpdrift_stem (the output path without extension).
cpdrift_settings() {
  CPDRIFT_ROOT=${CPDRIFT_ROOT:-${SLURM_SUBMIT_DIR}}
  CPDRIFT_BIN=${CPDRIFT_BIN:-$CPDRIFT_ROOT/build/cpdrift}
  CPDRIFT_DEVICE=${CPDRIFT_DEVICE:-cuda}
  CPDRIFT_LAUNCHER=${CPDRIFT_LAUNCHER:-srun}
  CPDRIFT_OUTDIR=${CPDRIFT_OUTDIR:-$PWD}
  CPDRIFT_DUMP=${CPDRIFT_DUMP:-0}
  case $CPDRIFT_DEVICE in
    cuda) CPDRIFT_TRANSPORT=${CPDRIFT_TRANSPORT:-nccl} ;;
    cpu) CPDRIFT_TRANSPORT=${CPDRIFT_TRANSPORT:-mpi} ;;
    *) cpdrift_die "CPDRIFT_DEVICE=$CPDRIFT_DEVICE: expected cuda or cpu" ;;
  esac
  case $CPDRIFT_LAUNCHER in
    srun | mpirun) ;;
    *) cpdrift_die "CPDRIFT_LAUNCHER=$CPDRIFT_LAUNCHER: expected srun or mpirun" ;;
  esac
  [[ -x $CPDRIFT_BIN ]] || cpdrift_die "CPDRIFT_BIN=$CPDRIFT_BIN is not an executable" \
    "(build it, or set CPDRIFT_BIN or CPDRIFT_ROOT)"
  mkdir -p "$CPDRIFT_OUTDIR"
  cpdrift_stem=$CPDRIFT_OUTDIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}
  cpdrift_device_args=(--device "$CPDRIFT_DEVICE" --transport "$CPDRIFT_TRANSPORT")
  [[ $CPDRIFT_DEVICE == cuda ]] && cpdrift_nccl_env
  return 0
}

cpdrift_die() {  # in a job $0 is Slurm's copy of the script: name the job instead
  echo "${SLURM_JOB_NAME:-${0##*/}}: $*" >&2
  exit 2
}

# The NCCL knobs (--device cuda). Each keeps the value the submitting shell gave it; otherwise
# it gets the default below, and an empty default leaves NCCL's own choice (nothing exported).
# Every value is printed in the job's log, so the output says what NCCL ran with.
cpdrift_nccl_env() {
  cpdrift_nccl_shown=()
  # What NCCL prints: WARN is errors only; INFO adds the topology, channels and transports it
  # chose, narrowed by NCCL_DEBUG_SUBSYS (INIT,NET: start-up and the network).
  cpdrift_nccl_knob NCCL_DEBUG WARN
  cpdrift_nccl_knob NCCL_DEBUG_SUBSYS INIT,NET
  # Inside a node: how far apart two GPUs may be for direct P2P copies. NVL keeps P2P on
  # NVLink/NVSwitch (H100/H200 SXM nodes); PIX, PXB or SYS allow PCIe paths.
  cpdrift_nccl_knob NCCL_P2P_LEVEL ""
  # Between nodes: the InfiniBand/RoCE HCAs and ports NCCL uses (e.g. mlx5_0:1,mlx5_1:1; a
  # leading = matches exactly), the RoCE v2 GID index (often 3), 1 to disable IB (TCP only),
  # and the IB retry timeout exponent (4.096 us x 2^N), raised on congested fabrics (e.g. 22).
  cpdrift_nccl_knob NCCL_IB_HCA ""
  cpdrift_nccl_knob NCCL_IB_GID_INDEX ""
  cpdrift_nccl_knob NCCL_IB_DISABLE ""
  cpdrift_nccl_knob NCCL_IB_TIMEOUT ""
  # NCCL's bootstrap and its TCP transport: which interfaces (e.g. ib0 or eth; ^lo,docker
  # excludes those prefixes). The default skips lo and docker* when anything else exists.
  cpdrift_nccl_knob NCCL_SOCKET_IFNAME ""
}

cpdrift_nccl_knob() {  # cpdrift_nccl_knob NAME DEFAULT
  local name=$1 value=${!1:-$2}
  if [[ -n $value ]]; then export "$name=$value"; fi
  cpdrift_nccl_shown+=("$name=${value:-(NCCL default)}")
}

# cpdrift_run_cases TP CP SEQ_LEN KV_CHUNK_SIZES [OPTIONS...]: the drift run of the TP x CP
# layout with OPTIONS on every task; the report is <stem>.json (and the dump <stem>.h5).
cpdrift_run_cases() {
  local tp=$1 cp=$2 seq_len=${CPDRIFT_SEQ_LEN:-$3} chunks=${CPDRIFT_KV_CHUNK_SIZES:-$4}
  shift 4
  local dump=() extra=()
  [[ $CPDRIFT_DUMP == 1 ]] && dump=(--dump "$cpdrift_stem.h5")
  read -r -a extra <<<"${CPDRIFT_EXTRA_ARGS:-}"
  cpdrift_launch "${cpdrift_device_args[@]}" --tp-world-sizes "$tp" --cp-world-sizes "$cp" \
    --seq-len "$seq_len" --kv-chunk-sizes "$chunks" "$@" \
    --progress --output "$cpdrift_stem.json" "${dump[@]}" "${extra[@]}"
}

# cpdrift_launch ARGS...: cpdrift ARGS on every task of the allocation, one process per task
# (per GPU); prints the command and its exit status (0 passed, 1 a check failed, 2 bad input,
# 3 a failure while running) and returns that status.
cpdrift_launch() {
  local launcher=() rc=0
  local per_node=$((SLURM_NTASKS / SLURM_NNODES)) cpus=${SLURM_CPUS_PER_TASK:-1}
  if [[ $CPDRIFT_LAUNCHER == srun ]]; then
    # srun no longer inherits --cpus-per-task from the allocation (Slurm 22.05): pass it on.
    # --wait=60: once a process has ended, the rest have a minute to end before Slurm kills
    # them, so a process that dies does not leave the others waiting. Not --kill-on-bad-exit
    # (turned off, whatever the site's default): status 1 and 2 are verdicts every process
    # reaches together, and it would kill the processes still exiting (CUDA's teardown,
    # LeakSanitizer's scan) and make the step's status 143 instead of the verdict.
    launcher=(srun --mpi=pmix --cpus-per-task="$cpus" --kill-on-bad-exit=0 --wait=60)
  else
    # Open MPI reads the allocation (nodes and slots) from Slurm and starts its daemons with
    # srun. Each process is bound to its task's CPUs -- hardware threads, as Slurm counts
    # them -- except in an overcommitted allocation (sbatch --overcommit: more tasks than
    # CPUs), where binding would fail: none there.
    launcher=(mpirun -np "$SLURM_NTASKS")
    if ((per_node * cpus <= ${SLURM_CPUS_ON_NODE:-0})); then
      launcher+=(--map-by "ppr:$per_node:node:PE=$cpus" --use-hwthread-cpus --bind-to hwthread)
    else
      launcher+=(--map-by "ppr:$per_node:node" --bind-to none)
    fi
  fi
  echo "# job ${SLURM_JOB_ID} (${SLURM_JOB_NAME}): ${SLURM_NNODES} node(s) ${SLURM_JOB_NODELIST}," \
    "${SLURM_NTASKS} tasks, ${cpus} CPU(s) each, device ${CPDRIFT_DEVICE}"
  [[ $CPDRIFT_DEVICE == cuda ]] && echo "# NCCL: ${cpdrift_nccl_shown[*]}"
  echo "# ${launcher[*]} $CPDRIFT_BIN $*"
  "${launcher[@]}" "$CPDRIFT_BIN" "$@" || rc=$?
  echo "# cpdrift exit status: $rc"
  return "$rc"
}
