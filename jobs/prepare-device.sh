#!/usr/bin/env bash
# Gathers what jobs/device-check.sh needs and a bare GPU machine lacks: the header-only
# libraries (RapidJSON, doctest), copied into the ignored folder .device/include, and nettle
# (the SHA-256 of the digests: its headers, its shared library in .device/lib and a relocatable
# nettle.pc in .device/lib/pkgconfig), pkg-config (pkgconf, in .device/bin, used only where the
# GPU machine has none) and Open MPI (.device/openmpi.tar.xz: runtime, headers and wrappers, as
# installed here, for jobs/device-check.sh to unpack where the GPU machine has no MPI, so the
# multi-process GPU suite runs there). Run it once on a machine that has them (Debian:
# apt-get install rapidjson-dev doctest-dev nettle-dev pkgconf libopenmpi-dev openmpi-bin), then
# carry .device along with the tree (docs/device.md).
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

bin=$root/.device/bin
mkdir -p "$bin"
cp "$(command -v pkgconf)" "$bin/pkg-config"
cp -P "$(dirname "$(ldd "$(command -v pkgconf)" | awk '/libpkgconf/ { print $3 }')")"/libpkgconf.so* "$lib/"

# Open MPI as dpkg installed it (absolute paths; documentation left out), with the libraries it
# links: device-check.sh unpacks it into / without replacing any file already there.
packages=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15
  libevent-core-2.1-7 libevent-pthreads-2.1-7)
dpkg -L "${packages[@]}" | grep -v -E '^/usr/share/(doc|man|lintian)/' |
  while read -r f; do [[ -f $f || -L $f ]] && [[ ! -d $f ]] && echo "${f#/}"; done |
  tar -C / -cJf "$root/.device/openmpi.tar.xz" -T -
echo "prepare-device: pkg-config in $bin, Open MPI $(dpkg-query -W -f '${Version}' libopenmpi3)" \
  "in .device/openmpi.tar.xz ($(du -sh "$root/.device/openmpi.tar.xz" | cut -f1))"
