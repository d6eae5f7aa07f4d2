#!/usr/bin/env bash
# Gathers what jobs/device-check.sh needs and a bare GPU machine lacks: the header-only
# libraries (RapidJSON, doctest), copied into the ignored folder .device/include, and nettle
# (the SHA-256 of the digests: its headers, its shared library in .device/lib and a relocatable
# nettle.pc in .device/lib/pkgconfig). Run it once on a machine that has them (Debian:
# apt-get install rapidjson-dev doctest-dev nettle-dev), then carry .device along with the tree
# (docs/device.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.device/include
mkdir -p "$dest"
for dir in rapidjson doctest nettle; do
  if [[ ! -d /usr/include/$dir ]]; then
    echo "prepare-device: /usr/include/$dir is missing (apt-get install rapidjson-dev doctest-dev nettle-dev)" >&2
    exit 1
  fi
  rm -rf "${dest:?}/$dir"
  cp -r "/usr/include/$dir" "$dest/"
done
lib=$root/.device/lib
libdir=$(pkg-config --variable=libdir nettle)
mkdir -p "$lib/pkgconfig"
cp -P "$libdir"/libnettle.so* "$lib/"
sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
  -e 's|^includedir=.*|includedir=${prefix}/include|' "$libdir/pkgconfig/nettle.pc" \
  >"$lib/pkgconfig/nettle.pc"
echo "prepare-device: headers in $dest ($(du -sh "$dest" | cut -f1)), nettle in $lib"
