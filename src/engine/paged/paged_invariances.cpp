// The bitwise invariances of a paged case: its rows against the same rows computed another way.
#include "engine/paged/paged_lanes.h"

namespace cpd::paged {

OutLseComparison same_rows(const AttnShard& c, const AttnShard& r, std::int64_t q_len) {
  OutLseComparison rows;
  for (int b = 0; b < c.out.shape.batch; ++b) {
    for (std::int64_t h = c.out.shape.heads.begin; h < c.out.shape.heads.end; ++h)
      add_rows(rows, c, b, 0, r, b, 0, h, q_len);
  }
  return rows;
}

namespace {

InvarianceCheck invariance(std::string name, std::string compares, OutLseComparison rows,
                           std::string not_applicable = "") {
  InvarianceCheck inv;
  inv.name = std::move(name);
  inv.compares = std::move(compares);
  inv.applicable = not_applicable.empty();
  inv.reason = std::move(not_applicable);
  inv.rows = std::move(rows);
  return inv;
}

}  // namespace

void add_invariances(const PagedWorkload& w, const PlanLanes& l, PagedCaseOutputs& o) {
  const PagedMode m = o.spec.mode;
  const AttnShard& rows = l.mode_rows(m);
  const std::string mode = to_string(m);
  OutLseComparison alone;
  for (std::size_t b = 0; b < l.alone.at(m).size(); ++b) {
    const AttnShard& a = l.alone.at(m)[b];
    for (std::int64_t h = a.out.shape.heads.begin; h < a.out.shape.heads.end; ++h) {
      add_rows(alone, rows, static_cast<int>(b), 0, a, 0, 0, h, w.q_len);
    }
  }
  o.invariances.push_back(invariance(
      "batch_composition",
      mode + " rows of every sequence in one batch vs each sequence alone in its own cache",
      std::move(alone), w.sequences() < 2 ? "one sequence: no batch to compose" : ""));
  o.invariances.push_back(invariance(
      "page_layout",
      mode + " rows on the allocator's page layout vs the physical pages shuffled (block tables "
             "remapped)",
      same_rows(rows, l.permuted.at(m), w.q_len),
      o.physical_pages < 2 ? "one physical page: nothing to shuffle" : ""));
  o.invariances.push_back(invariance(
      "prefix_cache",
      mode + " rows with the prompt's pages shared by every sequence vs private copies",
      same_rows(rows, l.private_prefix.at(m), w.q_len),
      w.prefix_pages() == 0 ? "no shared prompt prefix (one sequence, or too short for a page)"
                            : ""));
  OutLseComparison decode_full;
  for (int b = 0; b < w.sequences(); ++b) {
    for (std::int64_t h = l.decode.out.shape.heads.begin; h < l.decode.out.shape.heads.end; ++h) {
      add_rows(decode_full, l.decode, b, 0, l.full_prefill, b, w.queries(b).begin, h, w.q_len);
    }
  }
  o.invariances.push_back(invariance(
      "decode_vs_prefill",
      "decode step t vs row t of the full paged prefill (the trainer's rows read from the cache)",
      std::move(decode_full)));
  o.invariances.push_back(
      invariance("query_position_paged_prefill",
                 "decode step t vs row t of the paged prefill of the last q_len positions",
                 same_rows(l.decode, l.paged_prefill, w.q_len)));
  o.invariances.push_back(invariance(
      "query_position_chunked_prefill",
      "decode step t vs row t of the contiguous chunked prefill (query chunks of 3 pages, each "
      "attending [0, chunk end), no cache)",
      same_rows(l.decode, l.chunked, w.q_len)));
}

}  // namespace cpd::paged
