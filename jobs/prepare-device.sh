#!/usr/bin/env bash
# Gathers what jobs/device-check.sh needs and a bare GPU machine lacks: the header-only
# libraries (RapidJSON, doctest), copied into the ignored folder .device/include. Run it once
# on a machine that has them (Debian: apt-get install rapidjson-dev doctest-dev), then carry
# .device along with the tree (docs/device.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.device/include
mkdir -p "$dest"
for dir in rapidjson doctest; do
  if [[ ! -d /usr/include/$dir ]]; then
    echo "prepare-device: /usr/include/$dir is missing (apt-get install rapidjson-dev doctest-dev)" >&2
    exit 1
  fi
  rm -rf "${dest:?}/$dir"
  cp -r "/usr/include/$dir" "$dest/"
done
echo "prepare-device: headers in $dest ($(du -sh "$dest" | cut -f1))"
