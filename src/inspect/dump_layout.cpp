#include "inspect/dump_layout.h"

#include "report/run_report.h"

namespace cpd::inspect::layout {
namespace {

// Extents and sizes a real run never comes near; past them a value is corruption, and checking
// keeps every product below in range.
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 31;
constexpr std::int64_t kMaxWorld = std::int64_t{1} << 16;  // TP or CP ranks of one case

const DumpValue& required(const DumpAttributes& a, const std::string& name, const std::string& file,
                          const std::string& object) {
  const DumpValue* v = find_attribute(a, name);
  if (v == nullptr) throw InspectError(file + ": " + object + " has no attribute " + name);
  return *v;
}

const std::string& text(const DumpAttributes& a, const std::string& name, const std::string& file,
                        const std::string& object) {
  const auto* s = std::get_if<std::string>(&required(a, name, file, object));
  if (s == nullptr)
    throw InspectError(file + ": attribute " + name + " of " + object + " is not text");
  return *s;
}

std::int64_t positive(const DumpAttributes& a, const std::string& name, const std::string& file,
                      const std::string& object) {
  const auto* i = std::get_if<std::int64_t>(&required(a, name, file, object));
  if (i == nullptr || *i < 1 || *i > kMaxExtent) {
    throw InspectError(file + ": attribute " + name + " of " + object +
                       " is not a positive integer below 2^31");
  }
  return *i;
}

std::string optional_text(const DumpAttributes& a, const std::string& name) {
  const DumpValue* v = find_attribute(a, name);
  const auto* s = v != nullptr ? std::get_if<std::string>(v) : nullptr;
  return s != nullptr ? *s : "";
}

template <class E, std::size_t N>
E parse_name(const EnumName<E> (&table)[N], const std::string& name, const std::string& file,
             const std::string& what) {
  for (const EnumName<E>& e : table) {
    if (name == e.name) return e.value;
  }
  throw InspectError(file + ": " + what + " \"" + name + "\" is not one cpdrift writes");
}

}  // namespace

DumpProblem read_problem(const DumpAttributes& root, const std::string& file) {
  const DumpValue* schema = find_attribute(root, "schema_version");
  const auto* version = schema != nullptr ? std::get_if<std::string>(schema) : nullptr;
  if (version == nullptr)
    throw InspectError(file + ": not a cpdrift dump (no schema_version attribute on /)");
  if (*version != kReportSchema) {
    throw InspectError(file + ": schema \"" + *version + "\"; cpdrift-inspect reads " +
                       kReportSchema);
  }
  DumpProblem d;
  d.schema_version = *version;
  d.producer = optional_text(root, "producer");
  d.created_at_utc = optional_text(root, "created_at_utc");
  d.command = optional_text(root, "command");
  Problem& p = d.problem;
  p.batch = static_cast<int>(positive(root, "batch", file, "/"));
  p.seq_len = positive(root, "seq_len", file, "/");
  p.dims.num_q_heads = static_cast<int>(positive(root, "num_query_heads", file, "/"));
  p.dims.num_kv_heads = static_cast<int>(positive(root, "num_kv_heads", file, "/"));
  p.dims.head_dim = static_cast<int>(positive(root, "head_dim", file, "/"));
  // Absent in dumps written before the layer's tensors had a dump (none of theirs to check).
  if (find_attribute(root, "hidden_size") != nullptr)
    p.dims.hidden_size = static_cast<int>(positive(root, "hidden_size", file, "/"));
  // The model names the cases (a dump of another model than the default says which).
  if (const std::string model = optional_text(root, "model"); !model.empty()) p.dims.name = model;
  if (const std::string source = optional_text(root, "model_source"); !source.empty())
    p.dims.source = source;
  const auto* seed = std::get_if<std::int64_t>(&required(root, "seed", file, "/"));
  if (seed == nullptr) throw InspectError(file + ": attribute seed of / is not an integer");
  p.seed = static_cast<std::uint64_t>(*seed);
  p.dtype = parse_name(kDTypeNames, text(root, "dtype", file, "/"), file, "dtype");
  p.rope = optional_text(root, "rope") != "not_composed";
  // Absent in dumps written before --input-distribution existed: those inputs were Gaussian.
  const std::string distribution = optional_text(root, "input_distribution");
  if (!distribution.empty()) {
    p.distribution = parse_name(kInputDistributionNames, distribution, file, "input_distribution");
  }
  return d;
}

CaseSpec read_case_spec(const DumpAttributes& a, const Problem& problem, const std::string& file,
                        const std::string& group) {
  CaseSpec spec;
  const std::int64_t tp = positive(a, "tp_world_size", file, group);
  const std::int64_t cp = positive(a, "cp_world_size", file, group);
  if (tp > kMaxWorld || cp > kMaxWorld) {
    throw InspectError(file + ": " + group + ": tp_world_size " + std::to_string(tp) +
                       ", cp_world_size " + std::to_string(cp) + ": not a case cpdrift runs");
  }
  spec.tp = static_cast<int>(tp);
  spec.cp = static_cast<int>(cp);
  const DumpValue& split = required(a, "split", file, group);
  if (const auto* size = std::get_if<std::int64_t>(&split)) {
    spec.split = *size;
  } else if (const auto* none = std::get_if<std::string>(&split);
             none == nullptr || *none != "none") {
    throw InspectError(file + ": attribute split of " + group + " is neither a size nor \"none\"");
  }
  spec.layout = parse_name(kCpLayoutNames, text(a, "layout", file, group), file, "layout");
  spec.protocol = parse_name(kProtocolNames, text(a, "protocol", file, group), file, "protocol");
  if (std::string why = validate_case(spec, problem); !why.empty())
    throw InspectError(file + ": " + group + ": " + why);
  return spec;
}

std::int64_t paged_q_len(const DumpAttributes& a, const std::string& file,
                         const std::string& group) {
  return positive(a, "q_len", file, group);
}

namespace {

// The extents of the layer's tensors (--scope layer: its output and input, the backward's
// gradients; engine/layer_leg.cpp), by their shape attribute; empty for a shape not the layer's.
std::vector<std::int64_t> layer_extents(const TensorInfo& t, const std::string& shape,
                                        const Problem& p) {
  const std::int64_t hidden = p.dims.hidden_size, d = p.dims.head_dim;
  const std::string name = t.path.substr(t.path.rfind('/') + 1);
  const std::int64_t heads = name[0] == 'q' ? p.dims.num_q_heads : p.dims.num_kv_heads;
  if (shape == "[B, 1, S, hidden]") return {p.batch, 1, p.seq_len, hidden};
  if (shape == "[B, S, hidden]") return {p.batch, p.seq_len, hidden};
  if (shape == "[heads, head_dim, hidden]") return {1, heads, d, hidden};
  if (shape == "[heads, head_dim, 1]") return {1, heads, d, 1};
  if (shape == "[heads, hidden, head_dim] (o_proj's columns of each head)")
    return {1, p.dims.num_q_heads, hidden, d};
  if (shape == "[head_dim]") return {1, 1, 1, d};
  return {};
}

}  // namespace

void check_tensor(TensorInfo& t, const Problem& problem, bool paged, std::int64_t q_len,
                  const std::string& file) {
  const DumpAttributes& a = t.attributes;
  const std::string& shape = text(a, "shape", file, t.path);
  const std::vector<std::int64_t> layer = layer_extents(t, shape, problem);
  if (!layer.empty()) {
    if (problem.dims.hidden_size < 1)
      throw InspectError(file + ": " + t.path + " is the layer's, but / has no hidden_size");
    if (t.shape != layer) {
      throw InspectError(file + ": " + t.path + " is " + shape_text(t.shape) + "; the run's " +
                         shape + " is " + shape_text(layer));
    }
  }
  const bool four = t.shape.size() == 4;
  // What the writers call each axis: S a sequence, Q a paged case's query rows, D the head dim.
  const bool known = !layer.empty() ||
                     (four ? shape == "[B, H, S, D]" || shape == "[B, H, Q, D]"
                           : shape == "[B, H, S]" || shape == "[B, 1, S]" || shape == "[B, H, Q]");
  if (!known) {
    throw InspectError(file + ": " + t.path + " has rank " + std::to_string(t.shape.size()) +
                       " but its shape attribute says " + shape);
  }
  const std::string& original = text(a, "original_dtype", file, t.path);
  if (original != "float32" && original != "bfloat16") {
    throw InspectError(file + ": " + t.path + ": original_dtype \"" + original +
                       "\" is neither float32 nor bfloat16");
  }
  t.bf16 = original == "bfloat16";
  if (find_attribute(a, "stored_dtype") != nullptr &&
      text(a, "stored_dtype", file, t.path) != "float32") {
    throw InspectError(file + ": " + t.path + ": stored_dtype is not float32");
  }
  if (!layer.empty()) return;  // its extents checked above
  // The extents the problem implies: heads by the `heads` attribute (the inputs by name).
  std::int64_t heads = problem.dims.num_q_heads;
  const std::string kind = optional_text(a, "heads");
  if (kind == "kv" || t.path == "/inputs/k" || t.path == "/inputs/v") {
    heads = problem.dims.num_kv_heads;
  } else if (shape == "[B, 1, S]") {
    heads = 1;
  }
  std::vector<std::int64_t> want{problem.batch, heads, paged ? q_len : problem.seq_len};
  if (four) want.push_back(problem.dims.head_dim);
  if (t.shape != want) {
    throw InspectError(file + ": " + t.path + " is " + shape_text(t.shape) + "; the run's " +
                       shape + " is " + shape_text(want));
  }
}

std::uint64_t tensor_bytes(const TensorInfo& t, const std::string& file) {
  std::uint64_t n = 4;
  for (const std::int64_t d : t.shape) {
    if (d < 1 || d > kMaxExtent || n > (std::uint64_t{1} << 62) / static_cast<std::uint64_t>(d))
      throw InspectError(file + ": " + t.path + " has an implausible extent " + std::to_string(d));
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

}  // namespace cpd::inspect::layout
