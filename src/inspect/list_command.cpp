// `cpdrift-inspect list`: the dump's run, cases, tensors, shapes and attributes.
#include <algorithm>

#include "inspect/command_line.h"
#include "inspect/dump_reader.h"
#include "report/json.h"

namespace cpd::inspect {
namespace {

using json::Value;

Value attributes_json(const DumpAttributes& attributes) {
  Value v = Value::object();
  for (const auto& [name, value] : attributes)
    std::visit([&](const auto& x) { v[name] = x; }, value);
  return v;
}

Value tensor_json(const TensorInfo& t) {
  return json::Object{{"path", t.path},
                      {"name", t.leg_path()},
                      {"shape", json::Array(t.shape.begin(), t.shape.end())},
                      {"original_dtype", t.bf16 ? "bfloat16" : "float32"},
                      {"stored_dtype", "float32"},
                      {"attributes", attributes_json(t.attributes)}};
}

// "name=value" for every attribute but those `skip` names.
std::string attribute_line(const DumpAttributes& attributes,
                           std::initializer_list<const char*> skip) {
  std::string line;
  for (const auto& [name, value] : attributes) {
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    line += (line.empty() ? "" : "  ") + name + "=" + attribute_text(value);
  }
  return line;
}

void print_tensor(std::FILE* out, const TensorInfo& t) {
  std::fprintf(out, "  %-34s %-20s %-9s %s\n", t.leg_path().c_str(), shape_text(t.shape).c_str(),
               t.bf16 ? "bfloat16" : "float32",
               attribute_line(t.attributes, {"original_dtype", "stored_dtype"}).c_str());
}

}  // namespace

int list_command(const Arguments& a, std::FILE* out) {
  const DumpFile dump = DumpFile::open(a.operands[0]);
  const DumpProblem& d = dump.problem();
  const std::optional<std::string> report = dump.report_json();
  if (a.json) {
    json::Array inputs;
    for (const TensorInfo& t : dump.tensors()) {
      if (t.path.rfind("/inputs/", 0) == 0) inputs.push_back(tensor_json(t));
    }
    const auto one_case = [&](const CaseInfo& c) {
      return json::Object{{"case_name", c.name},
                          {"kind", c.paged ? "paged" : "prefill"},
                          {"group", (c.paged ? "/paged_cases/" : "/cases/") + c.name},
                          {"attributes", attributes_json(c.attributes)},
                          {"tensors", json::array_of(c.tensors, [&](std::size_t i) {
                             return tensor_json(dump.tensors()[i]);
                           })}};
    };
    const Value v = json::Object{{"file", dump.path()},
                                 {"schema_version", d.schema_version},
                                 {"producer", d.producer},
                                 {"created_at_utc", d.created_at_utc},
                                 {"command", d.command},
                                 {"attributes", attributes_json(dump.root_attributes())},
                                 {"inputs", std::move(inputs)},
                                 {"cases", json::array_of(dump.cases(), one_case)},
                                 {"report_json_bytes", report ? Value(report->size()) : Value()}};
    std::fputs(json::to_string(v).c_str(), out);
    return 0;
  }
  std::fprintf(out, "# %s: cpdrift dump, %s, %s\n", dump.path().c_str(), d.schema_version.c_str(),
               d.producer.empty() ? "producer unknown" : d.producer.c_str());
  std::fprintf(out, "# problem : %s\n", problem_text(d.problem).c_str());
  if (!d.created_at_utc.empty()) std::fprintf(out, "# created : %s\n", d.created_at_utc.c_str());
  if (!d.command.empty()) std::fprintf(out, "# command : %s\n", d.command.c_str());
  std::fprintf(
      out, "# report  : %s\n",
      report ? ("/report_json, " + std::to_string(report->size()) + " bytes").c_str() : "none");
  bool inputs = false;
  for (const TensorInfo& t : dump.tensors()) {
    if (t.path.rfind("/inputs/", 0) != 0) continue;
    if (!inputs) std::fprintf(out, "\ninputs (/inputs)\n");
    inputs = true;
    print_tensor(out, t);
  }
  for (const CaseInfo& c : dump.cases()) {
    std::fprintf(out, "\n%s %s  %s\n", c.paged ? "paged case" : "case", c.name.c_str(),
                 attribute_line(c.attributes, {}).c_str());
    for (const std::size_t i : c.tensors) print_tensor(out, dump.tensors()[i]);
  }
  std::fprintf(out, "\n# %zu case%s, %zu tensors\n", dump.cases().size(),
               dump.cases().size() == 1 ? "" : "s", dump.tensors().size());
  return 0;
}

}  // namespace cpd::inspect
