// Reading MACE's model files (issue 46): the TorchScript export with LibTorch
// alone, or a torch.save'd state_dict with its hyper-parameters as JSON.
// See include/crucible/models/mace/mace_import.h.

#include "crucible/models/mace/mace_import.h"
#include "crucible/common/error.h"
#include "crucible/models/torch_save_reader.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

namespace crucible {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open the file");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A Python str of a value (config.yaml of the TorchScript export) as JSON:
/// "5.0" → 5.0, "[64, 64, 64]" → [64, 64, 64], "None" → null, "False" →
/// false, "<class 'mace.modules.blocks.X'>" → "X", "<function silu at
/// 0x…>" → "silu", "['Default']" → ["Default"]; anything else stays a string.
nlohmann::json python_value(const std::string& text) {
  static const std::regex cls(R"(^<class '(?:[\w.]*\.)?(\w+)'>$)");
  static const std::regex fn(R"(^<(?:function|built-in function) (\w+)(?: at 0x[0-9a-f]+)?>$)");
  std::smatch m;
  if (std::regex_match(text, m, cls) || std::regex_match(text, m, fn)) return m[1].str();
  if (text == "None") return nullptr;
  if (text == "True") return true;
  if (text == "False") return false;
  std::string json = text;
  std::replace(json.begin(), json.end(), '\'', '"');
  // Python's tuples and None/True/False inside lists.
  json = std::regex_replace(json, std::regex(R"(\bNone\b)"), "null");
  json = std::regex_replace(json, std::regex(R"(\bTrue\b)"), "true");
  json = std::regex_replace(json, std::regex(R"(\bFalse\b)"), "false");
  std::replace(json.begin(), json.end(), '(', '[');
  std::replace(json.begin(), json.end(), ')', ']');
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded() && (parsed.is_number() || parsed.is_array() || parsed.is_object())) return parsed;
  return text;
}

/// Hyper-parameters with typed values whatever the source wrote.
nlohmann::json typed_hyperparameters(const nlohmann::json& raw) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : raw.items()) out[key] = value.is_string() ? python_value(value.get<std::string>()) : value;
  return out;
}

nlohmann::json parse_json_file(const std::string& path, const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw DataError(path + ": must be a JSON object of MACE hyper-parameters");
  return typed_hyperparameters(j);
}

}  // namespace

MaceFile read_mace_torchscript(const std::string& path) {
  MaceFile f;
  f.path = path;
  f.format = "torchscript";
  const std::string bytes = read_bytes(path);
  torch::jit::ExtraFilesMap extra{{"config.yaml", ""}};
  torch::jit::Module module;
  try {
    std::istringstream in(bytes);
    module = torch::jit::load(in, c10::Device(c10::kCPU), extra);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    const bool version = why.find("version") != std::string::npos || why.find("Unknown builtin") != std::string::npos ||
                         why.find("schema") != std::string::npos;
    throw DataError(path + ": cannot be read as TorchScript by this LibTorch (" + why + ")" +
                    (version ? "; it was probably written by a newer PyTorch: convert the .model pickle where MACE is "
                               "installed with `python3 -m crucible.mace_to_pt MODEL OUT.pt` and import OUT.pt with "
                               "--hyperparameters OUT.json"
                             : ""));
  }
  if (extra["config.yaml"].empty()) {
    throw DataError(path + ": has no extra file config.yaml (MACE writes it with the TorchScript export); import the "
                    ".pt checkpoint with --hyperparameters instead");
  }
  f.hyperparameters = parse_json_file(path + " (extra/config.yaml)", extra["config.yaml"]);
  for (const auto& p : module.named_parameters(/*recurse=*/true)) f.tensors[p.name] = p.value.detach().to(at::kCPU);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) f.tensors[b.name] = b.value.detach().to(at::kCPU);
  std::map<int64_t, double> avg;
  static const std::regex block(R"(^interactions\.(\d+)$)");
  for (const auto& m : module.named_modules()) {
    std::smatch match;
    if (!std::regex_match(m.name, match, block) || !m.value.hasattr("avg_num_neighbors")) continue;
    avg[std::stoll(match[1].str())] = m.value.attr("avg_num_neighbors").toDouble();
  }
  for (const auto& [t, v] : avg) f.avg_num_neighbors.push_back(v);
  f.script = std::make_shared<torch::jit::Module>(module);
  return f;
}

MaceFile read_mace_state_dict(const std::string& pt_path, const std::string& hyperparameters_json) {
  MaceFile f;
  f.path = pt_path;
  f.format = "state_dict";
  try {
    f.tensors = read_torch_save_state_dict(pt_path);
  } catch (const DataError& e) {
    // A pickled MACE model (.model) calls MACE's classes.
    throw DataError(std::string(e.what()) +
                    "; a whole pickled MACE model (.model) needs MACE's Python package: python3 -m crucible.mace_to_pt "
                    "MODEL OUT.pt, then import OUT.pt with --hyperparameters OUT.json");
  }
  f.hyperparameters = parse_json_file(hyperparameters_json, read_bytes(hyperparameters_json));
  return f;
}

}  // namespace crucible
