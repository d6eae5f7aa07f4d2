// The dump's layout (docs/inspect.md), checked as it is read: the root's attributes, the groups
// /cases, /paged_cases and /inputs, and every tensor dataset in them.
#include "inspect/dump_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <tuple>

#include "inspect/dump_layout.h"
#include "io/h5_support.h"

namespace cpd::inspect {

namespace {

char being_read[4096] = "";

// Runs `f` with `file` named as the one HDF5 reads (truncated to the buffer), for the fault guard,
// and clears the name after: a fault outside an HDF5 read blames no file. A refusal of the HDF5
// support (io/h5_support.h) becomes this tool's InspectError.
template <class F>
auto reading(const std::string& file, F&& f) {
  const std::size_t n = std::min(file.size(), sizeof being_read - 1);
  std::memcpy(being_read, file.data(), n);
  being_read[n] = '\0';
  struct Clear {
    ~Clear() { being_read[0] = '\0'; }
  } clear;
  try {
    return f();
  } catch (const h5::FileError& e) {
    throw InspectError(e.what());
  }
}

}  // namespace

const char* file_being_read() { return being_read; }

const DumpValue* find_attribute(const DumpAttributes& attributes, const std::string& name) {
  const auto at = std::find_if(attributes.begin(), attributes.end(),
                               [&](const auto& a) { return a.first == name; });
  return at != attributes.end() ? &at->second : nullptr;
}

std::string attribute_text(const DumpValue& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&value)) return std::to_string(*i);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", std::get<double>(value));
  return buf;
}

std::string problem_text(const Problem& p) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s B=%d S=%lld Hq=%d Hkv=%d D=%d, dtype %s, seed %llu%s",
                p.dims.name.c_str(), p.batch, static_cast<long long>(p.seq_len), p.dims.num_q_heads,
                p.dims.num_kv_heads, p.dims.head_dim, to_string(p.dtype),
                static_cast<unsigned long long>(p.seed), p.rope ? ", RoPE" : ", no RoPE");
  std::string text = buf;
  if (p.distribution != InputDistribution::gaussian)
    text += std::string(", ") + to_string(p.distribution) + " inputs";
  return text;
}

std::int64_t TensorInfo::elements() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::leg_path() const {
  // "/cases/<case>/<leg>/<name>" → "<leg>/<name>"; "/inputs/q" → "inputs/q".
  for (const char* group : {"/cases/", "/paged_cases/"}) {
    if (path.rfind(group, 0) == 0) {
      const std::size_t after_case = path.find('/', std::strlen(group));
      return after_case == std::string::npos ? path : path.substr(after_case + 1);
    }
  }
  return path.substr(1);
}

struct DumpFile::Impl {
  // A dump opened by `open` (a path or a memory image) and validated, `name` in messages.
  template <class Open>
  static DumpFile opened(const std::string& name, Open&& open) {
    auto impl = std::make_unique<Impl>();
    impl->path = name;
    reading(name, [&] {
      try {
        impl->file = open();
        impl->load();
      } catch (const std::bad_alloc&) {
        throw InspectError(name + ": out of memory reading the file's metadata (corrupted?)");
      }
    });
    return DumpFile(std::move(impl));
  }

  // The file closes here, named: a fault in HDF5's close names it too.
  ~Impl() {
    reading(path, [&] { file.close(); });
  }

  std::string path;
  h5::Handle file;
  DumpProblem problem;
  DumpAttributes root;
  std::vector<CaseInfo> cases;
  std::vector<TensorInfo> tensors;
  bool has_report = false;
  std::uint64_t file_bytes = 0;

  // The whole layout, metadata only.
  void load() {
    hsize_t size = 0;
    if (H5Fget_filesize(file.get(), &size) >= 0) file_bytes = size;
    root = h5::read_attributes(file.get(), "/", path);
    problem = layout::read_problem(root, path);
    for (const h5::Member& m : h5::members(file.get(), "/", path)) {
      const std::string at = "/" + m.name;
      if (m.name == "report_json") {
        if (m.kind != h5::Kind::dataset)
          throw InspectError(path + ": /report_json is not a dataset");
        has_report = true;
      } else if (m.name == "cases" || m.name == "paged_cases") {
        if (m.kind != h5::Kind::group) throw InspectError(path + ": " + at + " is not a group");
        load_cases(at, m.name == "paged_cases");
      } else if (m.name == "inputs") {
        if (m.kind != h5::Kind::group) throw InspectError(path + ": " + at + " is not a group");
        load_tensors(at, nullptr);
      }  // anything else is not the dump's: left alone
    }
    if (cases.empty()) throw InspectError(path + ": a cpdrift dump without any case");
    std::stable_sort(cases.begin(), cases.end(), [](const CaseInfo& a, const CaseInfo& b) {
      const auto key = [](const CaseInfo& c) {
        return std::make_tuple(c.paged, c.spec.tp, c.spec.cp, c.spec.split.value_or(0),
                               static_cast<int>(c.spec.layout), static_cast<int>(c.spec.protocol));
      };
      return key(a) < key(b);
    });
    std::sort(tensors.begin(), tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return a.path < b.path; });
    for (CaseInfo& c : cases) {
      const std::string prefix = (c.paged ? "/paged_cases/" : "/cases/") + c.name + "/";
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (tensors[i].path.rfind(prefix, 0) == 0) c.tensors.push_back(i);
      }
    }
  }

  void load_cases(const std::string& group, bool paged) {
    for (const h5::Member& m : h5::members(file.get(), group, path)) {
      const std::string at = group + "/" + m.name;
      if (m.kind != h5::Kind::group) throw InspectError(path + ": " + at + " is not a case group");
      CaseInfo c;
      c.name = m.name;
      c.paged = paged;
      c.attributes = h5::read_attributes(file.get(), at, path);
      if (!paged) c.spec = layout::read_case_spec(c.attributes, problem.problem, path, at);
      const std::int64_t q_len = paged ? layout::paged_q_len(c.attributes, path, at) : 0;
      for (const h5::Member& leg : h5::members(file.get(), at, path)) {
        const std::string leg_at = at + "/" + leg.name;
        if (leg.kind != h5::Kind::group)
          throw InspectError(path + ": " + leg_at + " is not a group of tensors");
        load_tensors(leg_at, &c, q_len);
      }
      // Every case of a run publishes tensors; a group without any is not a case.
      const auto in_case = [&](const TensorInfo& t) { return t.path.rfind(at + "/", 0) == 0; };
      if (std::none_of(tensors.begin(), tensors.end(), in_case)) {
        throw InspectError(path + ": " + at + " holds no tensor");
      }
      cases.push_back(std::move(c));
    }
  }

  // A leg's tensors; the layer's legs (layer, layer_backward) hold a group each for the
  // candidate and the reference (layer/candidate/out), one level deeper, and one of the
  // reduction lanes (layer/tp_lanes/<lane>, layer_backward/tp_lanes/<lane>/<gradient>).
  void load_tensors(const std::string& group, const CaseInfo* in_case, std::int64_t q_len = 0,
                    int lane_depth = 0) {
    const std::string leg = group.substr(group.rfind('/') + 1);
    const bool layer_leg = in_case != nullptr && (leg == "layer" || leg == "layer_backward");
    for (const h5::Member& m : h5::members(file.get(), group, path)) {
      const std::string at = group + "/" + m.name;
      if (layer_leg && m.kind == h5::Kind::group &&
          (m.name == "candidate" || m.name == "reference")) {
        load_tensors(at, nullptr);
        continue;
      }
      if (m.kind == h5::Kind::group &&
          ((layer_leg && m.name == "tp_lanes") || (lane_depth == 1 && leg == "tp_lanes"))) {
        load_tensors(at, nullptr, 0, lane_depth + 1);  // the lanes, then a lane's gradients
        continue;
      }
      if (m.kind != h5::Kind::dataset) throw InspectError(path + ": " + at + " is not a dataset");
      TensorInfo t = describe(at);
      layout::check_tensor(t, problem.problem, in_case != nullptr && in_case->paged, q_len, path);
      tensors.push_back(std::move(t));
    }
  }

  // Shape, dtype and attributes of the dataset at `at`, checked against what a dump writes.
  TensorInfo describe(const std::string& at) const {
    TensorInfo t;
    t.path = at;
    const h5::Dataset data(file.get(), at, path);
    if (data.type_class() != H5T_FLOAT || data.type_size() != 4) {
      throw InspectError(path + ": " + at + " is not FP32 (a " + std::to_string(data.type_size()) +
                         "-byte " + (data.type_class() == H5T_FLOAT ? "float" : "non-float") +
                         " dataset)");
    }
    t.shape = data.shape();
    if (t.shape.size() != 3 && t.shape.size() != 4) {
      throw InspectError(path + ": " + at + " has rank " + std::to_string(t.shape.size()) +
                         " (a dump's tensors are [B, H, S] or [B, H, S, D])");
    }
    t.attributes = h5::read_attributes(file.get(), at, path);
    // The values must all be there: a dataset the writer never finished has less storage.
    const std::uint64_t want = layout::tensor_bytes(t, path);
    const hsize_t stored = H5Dget_storage_size(data.get());
    if (stored != want || (file_bytes > 0 && want > file_bytes)) {
      throw InspectError(path + ": " + at + " stores " + std::to_string(stored) +
                         " bytes; its shape needs " + std::to_string(want));
    }
    return t;
  }
};

DumpFile::DumpFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DumpFile::DumpFile(DumpFile&&) noexcept = default;
DumpFile& DumpFile::operator=(DumpFile&&) noexcept = default;
DumpFile::~DumpFile() = default;

DumpFile DumpFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw InspectError(path + ": no such file");
  if (fs::is_directory(status)) throw InspectError(path + ": is a directory, not a dump");
  if (!std::ifstream(path, std::ios::binary)) throw InspectError(path + ": cannot be read");
  if (fs::is_regular_file(status) && fs::file_size(path, ec) == 0)
    throw InspectError(path + ": empty file (0 bytes), not a dump");
  return Impl::opened(path, [&] { return h5::open_file(path); });
}

DumpFile DumpFile::open_image(const void* data, std::size_t size, const std::string& name) {
  if (size == 0) throw InspectError(name + ": empty file (0 bytes), not a dump");
  return Impl::opened(name, [&] { return h5::open_image(data, size, name); });
}

const std::string& DumpFile::path() const { return impl_->path; }
const DumpProblem& DumpFile::problem() const { return impl_->problem; }
const DumpAttributes& DumpFile::root_attributes() const { return impl_->root; }
const std::vector<CaseInfo>& DumpFile::cases() const { return impl_->cases; }
const std::vector<TensorInfo>& DumpFile::tensors() const { return impl_->tensors; }

const CaseInfo* DumpFile::find_case(const std::string& name) const {
  for (const CaseInfo& c : impl_->cases) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const TensorInfo* DumpFile::find(const std::string& path) const {
  const auto& t = impl_->tensors;
  const auto at =
      std::lower_bound(t.begin(), t.end(), path,
                       [](const TensorInfo& x, const std::string& p) { return x.path < p; });
  return at != t.end() && at->path == path ? &*at : nullptr;
}

std::vector<float> DumpFile::read(const TensorInfo& tensor) const {
  const std::string& file = impl_->path;
  return reading(file, [&] {
    const h5::Dataset data(impl_->file.get(), tensor.path, file);
    try {
      return data.read<float>();
    } catch (const std::bad_alloc&) {
      throw InspectError(file + ": " + tensor.path + " does not fit in memory (" +
                         std::to_string(tensor.elements()) + " values)");
    }
  });
}

std::optional<std::string> DumpFile::report_json() const {
  if (!impl_->has_report) return std::nullopt;
  const std::string& file = impl_->path;
  return reading(file, [&] {
    const h5::Dataset data(impl_->file.get(), "/report_json", file);
    if (impl_->file_bytes > 0 && data.type_size() > impl_->file_bytes)
      throw InspectError(file + ": /report_json is larger than the file");
    return std::optional<std::string>(data.read_text());
  });
}

}  // namespace cpd::inspect
