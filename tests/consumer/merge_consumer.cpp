// A project outside cpdrift: built against cpdrift's installed headers with only what
// `pkg-config --cflags cpdrift` gives (tests/check_consumer.py), it prints the bits of
// results.h, one hex word a line; `--flip` changes one input bit (the negative control).
#include <cpdrift/block_merge.h>

#include <cstdio>
#include <cstring>

#include "results.h"

int main(int argc, char** argv) {
  const bool flip = argc > 1 && std::strcmp(argv[1], "--flip") == 0;
  const auto merge = [](const std::vector<cpd::BlockState>& s, std::int64_t rows, int dim,
                        float* out,
                        float* lse) { cpd::merge_in_block_order(s, rows, dim, out, lse); };
  for (const std::uint32_t u : consumer::results(consumer::make_states(flip), merge))
    std::printf("%08x\n", u);
  return 0;
}
