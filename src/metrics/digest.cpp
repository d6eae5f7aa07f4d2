#include "metrics/digest.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "core/util/sha256.h"
#include "core/util/sha256_lanes.h"
#include "cpdrift/bf16.h"

namespace cpd {
namespace {

// Each value's BF16 pattern (rounded to nearest even: the values are BF16-exact).
void bf16_patterns(const float* rows, std::size_t n, std::uint16_t* out) {
  for (std::size_t j = 0; j < n; ++j)
    out[j] = static_cast<std::uint16_t>(bf16_bits_rn_select(bits_of(rows[j])));
}

std::size_t element_bytes(DigestFormat format) {
  return format == DigestFormat::fp32 ? sizeof(float) : sizeof(std::uint16_t);
}

// Hashes a tensor's segments in the order they are fed, in `format`.
class TensorHasher {
 public:
  explicit TensorHasher(DigestFormat format) : format_(format) {}

  void update(const float* rows, std::size_t n) {
    if (format_ == DigestFormat::fp32) {
      sha_.update(rows, n * sizeof(float));
      return;
    }
    staging_.resize(n);
    bf16_patterns(rows, n, staging_.data());
    sha_.update(staging_.data(), n * sizeof(std::uint16_t));
  }
  std::string finish() { return Sha256::hex(sha_.finish()); }

 private:
  DigestFormat format_;
  Sha256 sha_;
  std::vector<std::uint16_t> staging_;
};

// A tensor's bytes for sha256_lanes, segment after segment: the FP32 values where they lie, or
// their BF16 patterns made a piece at a time in a buffer of its own (which stays in cache).
class TensorBytes {
 public:
  TensorBytes(const GlobalTensor& tensor, DigestFormat format)
      : segments_(tensor.segments), format_(format) {}

  std::span<const std::uint8_t> operator()() {
    while (segment_ < segments_.size() && offset_ == segments_[segment_].floats) {
      ++segment_;
      offset_ = 0;
    }
    if (segment_ == segments_.size()) return {};
    const StreamSegment& s = segments_[segment_];
    if (offset_ == 0 && s.floats > std::numeric_limits<std::size_t>::max() / element_bytes(format_))
      throw std::length_error("tensor digest: a segment of " + std::to_string(s.floats) +
                              " values, more bytes than memory can address");
    const auto bytes = [](const void* p, std::size_t n) {
      return std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(p), n);
    };
    if (format_ == DigestFormat::fp32) {
      offset_ = s.floats;
      return bytes(s.data, s.floats * sizeof(float));
    }
    const std::size_t n = std::min(kPiece, s.floats - offset_);
    staging_.resize(kPiece);
    bf16_patterns(s.data + offset_, n, staging_.data());
    offset_ += n;
    return bytes(staging_.data(), n * sizeof(std::uint16_t));
  }

 private:
  static constexpr std::size_t kPiece = 16384;  // values a piece: 32 KiB of patterns
  std::span<const StreamSegment> segments_;
  DigestFormat format_;
  std::size_t segment_ = 0, offset_ = 0;  // the next value: segment, and value within it
  std::vector<std::uint16_t> staging_;
};

// The values a tensor holds (saturating: only compared with a threshold).
std::size_t floats_of(const GlobalTensor& tensor) {
  std::size_t n = 0;
  for (const StreamSegment& s : tensor.segments)
    n = s.floats > std::numeric_limits<std::size_t>::max() - n
            ? std::numeric_limits<std::size_t>::max()
            : n + s.floats;
  return n;
}

}  // namespace

std::string stream_digest(const Collectives& coll, const GlobalTensor& tensor, DigestFormat format,
                          const PieceSink& also) {
  TensorHasher hasher(format);
  coll.stream_to_root(tensor.segments, [&](std::size_t i, const float* rows) {
    hasher.update(rows, tensor.segments[i].floats);
    if (also) also(tensor.pieces[i], rows);
  });
  return coll.root() ? hasher.finish() : std::string();
}

bool held_by_root(const GlobalTensor& tensor) {
  for (const StreamSegment& s : tensor.segments) {
    if (s.owner != 0) return false;
  }
  return true;
}

std::vector<LaneDigest> local_digests(std::span<const LocalDigestJob> jobs) {
  std::vector<ByteSpans> messages;
  for (const LocalDigestJob& j : jobs) messages.emplace_back(TensorBytes(*j.tensor, j.format));
  return sha256_lanes(messages);
}

std::string local_digest(const GlobalTensor& tensor, DigestFormat format) {
  const LocalDigestJob job{0, &tensor, format};
  const LaneDigest d = local_digests({&job, 1}).front();
  if (d.error) std::rethrow_exception(d.error);
  return Sha256::hex(d.digest);
}

PublishedDigests::PublishedDigests(std::size_t n) : promises_(n), settled_(n, false) {
  for (std::promise<std::string>& p : promises_) digests_.push_back(p.get_future().share());
}

void PublishedDigests::set(std::size_t i, std::string digest) {
  if (rest_given_) throw std::logic_error("PublishedDigests::set: after hash_rest");
  promises_.at(i).set_value(std::move(digest));
  settled_[i] = true;
}

void PublishedDigests::hash_rest(std::vector<LocalDigestJob> jobs) {
  if (hashing_.joinable() || rest_given_)
    throw std::logic_error("PublishedDigests::hash_rest: called twice");
  rest_given_ = true;
  for (const LocalDigestJob& j : jobs) settled_.at(j.index) = true;
  for (std::size_t i = 0; i < promises_.size(); ++i) {
    if (!settled_[i]) promises_[i].set_value("");
  }
  if (jobs.empty()) return;
  // The groups, in the order of their first job: a tensor of at least kLaneBytes joins the
  // first group not yet full of tensors of its size and format (their lanes end together), a
  // smaller one is hashed alone. jobs_ holds each group's jobs next to each other.
  constexpr std::size_t kLanes = 4, kLaneBytes = std::size_t{1} << 20;
  std::vector<std::vector<LocalDigestJob>> groups;
  for (const LocalDigestJob& j : jobs) {
    const std::size_t floats = floats_of(*j.tensor);
    const auto same = [&](const std::vector<LocalDigestJob>& g) {
      return g.size() < kLanes && g.front().format == j.format &&
             floats_of(*g.front().tensor) == floats;
    };
    const bool large = floats >= kLaneBytes / element_bytes(j.format);
    const auto open = large ? std::find_if(groups.begin(), groups.end(), same) : groups.end();
    if (open != groups.end()) {
      open->push_back(j);
    } else {
      groups.push_back({j});
    }
  }
  for (const std::vector<LocalDigestJob>& g : groups) {
    groups_.push_back({jobs_.size(), g.size()});
    jobs_.insert(jobs_.end(), g.begin(), g.end());
  }
  hashing_ = std::jthread([this] {
    while (hash_next()) {
    }
  });
}

bool PublishedDigests::hash_next() const {
  const std::size_t k = next_group_.fetch_add(1);
  if (k >= groups_.size()) return false;
  const std::span<const LocalDigestJob> group(jobs_.data() + groups_[k].first, groups_[k].second);
  std::vector<LaneDigest> digests;
  try {
    digests = local_digests(group);  // each tensor's own error in its LaneDigest
  } catch (...) {
    digests.assign(group.size(), LaneDigest{{}, std::current_exception()});
  }
  for (std::size_t i = 0; i < group.size(); ++i) {
    std::promise<std::string>& p = promises_[group[i].index];
    if (digests[i].error) {
      p.set_exception(digests[i].error);
    } else {
      p.set_value(Sha256::hex(digests[i].digest));
    }
  }
  return true;
}

const std::string& PublishedDigests::at(std::size_t i) const {
  const std::shared_future<std::string>& d = digests_.at(i);
  if (rest_given_) {
    while (d.wait_for(std::chrono::seconds(0)) != std::future_status::ready && hash_next()) {
    }
  }
  return d.get();
}

}  // namespace cpd
