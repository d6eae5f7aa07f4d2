#!/usr/bin/env bash
# Checks an image while it is built (containers/Dockerfile and containers/cpdrift.def call it):
#   check-image.sh build   at the end of the build stage: Open MPI's CUDA plugin was built, and
#                          nothing installed under /opt keeps a path to the CUDA driver stub
#                          (lib64/stubs) that the build linked against, nor a copy of it.
#   check-image.sh run     in the run stage: no libcuda anywhere in the image (the host's driver
#                          is mounted at run time), and every library cpdrift needs resolves.
set -euo pipefail

fail() {
  echo "check-image: $*" >&2
  exit 1
}

case "${1:-}" in
  build)
    [[ -f /opt/openmpi/lib/openmpi/mca_accelerator_cuda.so ]] ||
      fail "Open MPI was built without its CUDA component (mca_accelerator_cuda.so missing)"
    while IFS= read -r -d '' f; do
      if readelf -d "$f" 2>/dev/null | grep -E '\((RPATH|RUNPATH)\)' | grep -q stubs; then
        fail "$f: its RPATH/RUNPATH names the CUDA driver stub directory"
      fi
    done < <(find /opt/openmpi /opt/cpdrift -type f \( -name '*.so*' -o -perm -u+x \) -print0)
    if find /opt -name 'libcuda.so*' | grep .; then
      fail "a libcuda under /opt (the driver stub must stay in the build stage)"
    fi
    ;;
  run)
    if find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libcuda.so*' -print | grep .; then
      fail "libcuda in the run image: the driver must come from the host"
    fi
    # libcuda.so.1 may be wanted (the host provides it); nothing else may be missing.
    missing=$(ldd /opt/cpdrift/bin/cpdrift | grep 'not found' | grep -v 'libcuda\.so\.1 ' || true)
    [[ -z "$missing" ]] || fail "cpdrift's libraries do not all resolve: $missing"
    ;;
  *)
    fail "usage: check-image.sh build|run"
    ;;
esac
echo "check-image: $1 ok"
