// libFuzzer target: the reader cpdrift-inspect uses, over raw bytes taken as an HDF5 file image
// (DumpFile::open_image: HDF5's core driver over a copy). Seeds: tests/inspect/corpus_dump.
//
// Not in the fuzz suite: HDF5 1.10 does not checksum its metadata, and within seconds this finds
// inputs on which the library itself faults (a SIGSEGV in H5A__close freeing a half-decoded
// attribute; docs/inspect.md) — a fault in HDF5, not in cpdrift, which the tool's fault guard
// reports as one line. Run it by hand against a newer HDF5:
//   ninja -C build fuzz_dump_image && build/tests/fuzz_dump_image tests/inspect/corpus_dump
// fuzz_dump (the suite's) reaches the reader through well-formed files instead.
#include <cstddef>
#include <cstdint>

#include "fuzz_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return inspect_fuzz::run_one(
      [&] { return cpd::inspect::DumpFile::open_image(data, size, "fuzz.h5"); });
}
