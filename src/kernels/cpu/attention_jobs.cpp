// Spreading attention work over the thread pool, and the ordered merge.
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention.h"

namespace cpd {
namespace {

struct TileRef {
  std::size_t job;
  std::int64_t row;  // first row of the tile within the job
};

// The jobs' rows cut into tiles of `rows` rows (a job's last tile may be shorter).
template <class Job>
std::vector<TileRef> tiles_of(std::span<const Job> jobs, bool heaviest_first,
                              std::int64_t rows = kAttendRows) {
  std::vector<TileRef> tiles;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    for (std::int64_t r = 0; r < jobs[i].rows; r += rows) tiles.push_back(TileRef{i, r});
  }
  // Late rows see the most keys under the causal mask: start the heaviest tiles first so the
  // pool does not end waiting on one long tile.
  if (heaviest_first) {
    std::stable_sort(tiles.begin(), tiles.end(), [&](const TileRef& a, const TileRef& b) {
      return jobs[a.job].first_pos + a.row > jobs[b.job].first_pos + b.row;
    });
  }
  return tiles;
}

TileScratch& thread_scratch() {
  thread_local TileScratch scratch;
  return scratch;
}

}  // namespace

void run_block_jobs(std::span<const BlockJob> jobs, int dim, float scale, ProbRounding rounding,
                    ThreadPool& pool) {
  // In the jobs' order: a job is one KV block, so consecutive tiles read the same K and V rows
  // from cache. Sorted by row, the tiles of one row range went through every block and head
  // first, and at long sequences each block came back from memory once per row range. Unsorted,
  // a thread may end with one heavy tile left (a block's last rows see the most keys): at most
  // one tile's work, small beside a job's.
  const std::vector<TileRef> tiles = tiles_of(jobs, false);
  pool.parallel_for(static_cast<std::int64_t>(tiles.size()), [&](std::int64_t t) {
    const TileRef& tile = tiles[static_cast<std::size_t>(t)];
    const BlockJob& job = jobs[tile.job];
    const int rows = static_cast<int>(std::min<std::int64_t>(kAttendRows, job.rows - tile.row));
    attend_tile(job.q + tile.row * dim, job.first_pos + tile.row, rows, job.k, job.v, job.keys, dim,
                scale, rounding, thread_scratch(), job.out + tile.row * dim, job.lse + tile.row);
  });
}

void run_fold_jobs(std::span<const FoldJob> jobs, int dim, float scale, ProbRounding rounding,
                   ThreadPool& pool) {
  // A task takes kFoldRows rows and runs its tiles of kAttendRows block by block, so that a
  // block's K and V rows come from memory once for all of them rather than once a tile. Every
  // tile is the one it was (the same rows, the same blocks, merged in ascending order).
  constexpr std::int64_t kFoldRows = 4 * kAttendRows;
  const std::vector<TileRef> tasks = tiles_of(jobs, true, kFoldRows);
  pool.parallel_for(static_cast<std::int64_t>(tasks.size()), [&](std::int64_t t) {
    const TileRef& task = tasks[static_cast<std::size_t>(t)];
    const FoldJob& job = jobs[task.job];
    const std::int64_t rows = std::min(kFoldRows, job.rows - task.row);
    const std::int64_t first = job.first_pos + task.row;
    float* out = job.out + task.row * dim;
    float* lse = job.lse + task.row;
    std::fill(out, out + rows * dim, 0.0f);
    std::fill(lse, lse + rows, neg_inf_f32());
    std::vector<float> block_out(static_cast<std::size_t>(kAttendRows) * dim),
        block_lse(kAttendRows);
    for (const Range& block : job.blocks) {
      if (block.begin > first + rows - 1) break;  // wholly in the future of every row
      const std::int64_t offset = block.begin - job.kv_begin;
      for (std::int64_t tile = 0; tile < rows; tile += kAttendRows) {
        const int n = static_cast<int>(std::min<std::int64_t>(kAttendRows, rows - tile));
        // In the future of this tile's rows, not of the later tiles': the identity here.
        if (block.begin > first + tile + n - 1) continue;
        attend_tile(job.q + (task.row + tile) * dim, first + tile, n, job.k.from(offset),
                    job.v.from(offset), block, dim, scale, rounding, thread_scratch(),
                    block_out.data(), block_lse.data());
        for (int r = 0; r < n; ++r) {
          merge_state_row(out + (tile + r) * dim, lse + tile + r, block_out.data() + r * dim,
                          block_lse[r], dim);
        }
      }
    }
  });
}

void merge_in_block_order(std::span<const StateRef> states, std::int64_t rows, int dim, float* out,
                          float* lse) {
  // Ascending block index, ties in the order given: an insertion sort, which is stable and
  // needs no scratch memory, into a buffer each worker thread keeps (this runs once per batch,
  // head and query range). The states come in or near block order, where it is linear; in
  // reverse (the merge-order probe) it takes n²/2 steps, small beside the n × rows × dim of
  // the merge itself.
  thread_local std::vector<std::size_t> order;
  order.resize(states.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (std::size_t i = 1; i < order.size(); ++i) {
    const std::size_t moving = order[i];
    std::size_t j = i;
    for (; j > 0 && states[moving].block_index < states[order[j - 1]].block_index; --j)
      order[j] = order[j - 1];
    order[j] = moving;
  }
  // A row at a time through every state: each row's fold is the same sequence of operations
  // as state by state over all rows, and the row stays in L1 while its states stream past,
  // where state by state the whole of `out` would go through the caches once a state.
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row_out = out + r * dim;
    float* row_lse = lse + r;
    std::fill(row_out, row_out + dim, 0.0f);
    *row_lse = neg_inf_f32();
    for (std::size_t i : order)
      merge_state_row(row_out, row_lse, states[i].out + r * dim, states[i].lse[r], dim);
  }
}

}  // namespace cpd
