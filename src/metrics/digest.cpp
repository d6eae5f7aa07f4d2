#include "cpdrift/metrics/digest.h"

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cpdrift/numerics/bf16.h"
#include "cpdrift/util/sha256.h"

namespace cpd {
namespace {

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
    for (std::size_t j = 0; j < n; ++j)
      staging_[j] = static_cast<std::uint16_t>(bf16_bits_rn_select(bits_of(rows[j])));
    sha_.update(staging_.data(), n * sizeof(std::uint16_t));
  }
  std::string finish() { return Sha256::hex(sha_.finish()); }

 private:
  DigestFormat format_;
  Sha256 sha_;
  std::vector<std::uint16_t> staging_;
};

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

std::string local_digest(const GlobalTensor& tensor, DigestFormat format) {
  TensorHasher hasher(format);
  for (const StreamSegment& s : tensor.segments) hasher.update(s.data, s.floats);
  return hasher.finish();
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
  jobs_ = std::move(jobs);
  hashing_ = std::jthread([this] {
    while (hash_next()) {
    }
  });
}

bool PublishedDigests::hash_next() const {
  const std::size_t k = next_job_.fetch_add(1);
  if (k >= jobs_.size()) return false;
  const LocalDigestJob& j = jobs_[k];
  try {
    promises_[j.index].set_value(local_digest(*j.tensor, j.format));
  } catch (...) {
    promises_[j.index].set_exception(std::current_exception());
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
