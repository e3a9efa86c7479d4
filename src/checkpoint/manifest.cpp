#include "manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "crucible/checkpoint/sha256.h"
#include "crucible/common/error.h"

namespace crucible::checkpoint::detail {

using json = nlohmann::ordered_json;

namespace {

constexpr std::int64_t kSchemaVersion = 1;

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& expected,
                         const std::string& got) const {
    throw DataError(path_ + ": " + where + " must be " + expected + ", got " + got);
  }

  void expect_object(const json& v, const std::string& where,
                     std::initializer_list<const char*> required,
                     std::initializer_list<const char*> optional = {}) const {
    if (!v.is_object()) fail(where.empty() ? "the top level" : where, "an object", shown(v));
    for (const char* k : required)
      if (!v.contains(k)) fail(join(where, k), "present", "nothing");
    for (auto it = v.begin(); it != v.end(); ++it) {
      bool known = false;
      for (const char* k : required) known = known || it.key() == k;
      for (const char* k : optional) known = known || it.key() == k;
      if (!known) fail(join(where, it.key()), "absent (unknown key in schema_version 1)", "a value");
    }
  }

  std::int64_t int64(const json& v, const std::string& where, std::int64_t min) const {
    if (!v.is_number_integer()) fail(where, "an integer", shown(v));
    if (v.is_number_unsigned() &&
        v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(where, "at most 2^63-1", shown(v));
    const std::int64_t x = v.get<std::int64_t>();
    if (x < min) fail(where, ">= " + std::to_string(min), shown(v));
    return x;
  }

  std::uint64_t uint64(const json& v, const std::string& where) const {
    if (!v.is_number_unsigned()) fail(where, "a non-negative integer", shown(v));
    return v.get<std::uint64_t>();
  }

  std::string string(const json& v, const std::string& where) const {
    if (!v.is_string()) fail(where, "a string", shown(v));
    return v.get<std::string>();
  }

  double number(const json& v, const std::string& where) const {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
      if (s == "Infinity") return std::numeric_limits<double>::infinity();
      if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    }
    fail(where, "a number, \"NaN\", \"Infinity\" or \"-Infinity\"", shown(v));
  }

  static std::string join(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + "." + key;
  }

 private:
  std::string path_;
};

}  // namespace

std::string checkpoint_dir_name(std::int64_t index, std::int64_t revision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ckpt-%06lld", static_cast<long long>(index));
  std::string s = buf;
  if (revision > 0) s += ".r" + std::to_string(revision);
  return s;
}

std::optional<std::pair<std::int64_t, std::int64_t>> parse_dir_name(const std::string& name) {
  if (name.rfind("ckpt-", 0) != 0) return std::nullopt;
  std::string rest = name.substr(5);
  std::string idx = rest, rev;
  const auto dot = rest.find('.');
  if (dot != std::string::npos) {
    idx = rest.substr(0, dot);
    const std::string suffix = rest.substr(dot + 1);
    if (suffix.size() < 2 || suffix[0] != 'r') return std::nullopt;
    rev = suffix.substr(1);
    if (rev[0] == '0') return std::nullopt;
  }
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 18 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(idx) || (dot != std::string::npos && !digits(rev))) return std::nullopt;
  const std::int64_t index = std::stoll(idx);
  const std::int64_t revision = rev.empty() ? 0 : std::stoll(rev);
  if (checkpoint_dir_name(index, revision) != name) return std::nullopt;  // canonical form only
  return std::make_pair(index, revision);
}

std::vector<CheckpointEntry> parse_manifest(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    const std::size_t end = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(end), '\n');
    throw DataError(path + ":" + std::to_string(line) +
                    ": the manifest must be valid JSON (truncated or corrupted?), got: " + e.what());
  } catch (const json::exception& e) {
    // Valid syntax that nlohmann still refuses, e.g. a number out of
    // double's range ("1e2236": out_of_range.406). Found by fuzz_manifest.
    throw DataError(path + ": the manifest must be valid JSON (truncated or corrupted?), got: " + e.what());
  }
  const Reader r(path);
  r.expect_object(doc, "", {"schema_version", "checkpoints"});
  const std::int64_t version = r.int64(doc["schema_version"], "schema_version", 0);
  if (version != kSchemaVersion)
    r.fail("schema_version", std::to_string(kSchemaVersion), std::to_string(version));
  const json& list = doc["checkpoints"];
  if (!list.is_array()) r.fail("checkpoints", "an array", shown(list));

  std::vector<CheckpointEntry> out;
  std::set<std::int64_t> seen;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string w = "checkpoints[" + std::to_string(i) + "]";
    const json& c = list[i];
    r.expect_object(c, w, {"index", "dir", "step_count", "epoch_count", "counters", "time", "files"},
                    {"metric"});
    CheckpointEntry e;
    e.index = r.int64(c["index"], w + ".index", 0);
    if (!seen.insert(e.index).second) r.fail(w + ".index", "unique", "a repeated " + std::to_string(e.index));
    e.dir = r.string(c["dir"], w + ".dir");
    const auto parsed = parse_dir_name(e.dir);
    if (!parsed || parsed->first != e.index)
      r.fail(w + ".dir", "\"" + checkpoint_dir_name(e.index, 0) + "\" or \"" +
                             checkpoint_dir_name(e.index, 0) + ".r<k>\"", shown(c["dir"]));
    e.counters.step_count = r.int64(c["step_count"], w + ".step_count", std::numeric_limits<std::int64_t>::min());
    e.counters.epoch_count = r.int64(c["epoch_count"], w + ".epoch_count", std::numeric_limits<std::int64_t>::min());
    const json& counters = c["counters"];
    if (!counters.is_object()) r.fail(w + ".counters", "an object", shown(counters));
    for (auto it = counters.begin(); it != counters.end(); ++it) {
      if (it.key().empty()) r.fail(w + ".counters", "keyed by non-empty names", "\"\"");
      e.counters.extra[it.key()] =
          r.int64(it.value(), w + ".counters." + it.key(), std::numeric_limits<std::int64_t>::min());
    }
    e.time = r.string(c["time"], w + ".time");
    if (c.contains("metric")) {
      const json& m = c["metric"];
      r.expect_object(m, w + ".metric", {"name", "value"});
      CheckpointMetric metric;
      metric.name = r.string(m["name"], w + ".metric.name");
      if (metric.name.empty()) r.fail(w + ".metric.name", "non-empty", "\"\"");
      metric.value = r.number(m["value"], w + ".metric.value");
      e.metric = metric;
    }
    const json& files = c["files"];
    if (!files.is_array()) r.fail(w + ".files", "an array", shown(files));
    std::set<std::string> names;
    for (std::size_t j = 0; j < files.size(); ++j) {
      const std::string fw = w + ".files[" + std::to_string(j) + "]";
      const json& f = files[j];
      r.expect_object(f, fw, {"name", "size", "sha256"});
      CheckpointFileInfo info;
      info.name = r.string(f["name"], fw + ".name");
      if (!is_valid_file_name(info.name))
        r.fail(fw + ".name",
               "a plain relative name (one optional subfolder, [A-Za-z0-9._+=@-], no leading '.')",
               shown(f["name"]));
      if (!names.insert(info.name).second) r.fail(fw + ".name", "unique", shown(f["name"]));
      info.size = r.uint64(f["size"], fw + ".size");
      info.sha256 = r.string(f["sha256"], fw + ".sha256");
      if (!is_sha256_hex(info.sha256))
        r.fail(fw + ".sha256", "64 lowercase hex characters", shown(f["sha256"]));
      e.files.push_back(std::move(info));
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.index < b.index; });
  return out;
}

std::string dump_manifest(const std::vector<CheckpointEntry>& entries_in) {
  std::vector<const CheckpointEntry*> entries;
  for (const auto& e : entries_in) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(),
            [](const CheckpointEntry* a, const CheckpointEntry* b) { return a->index < b->index; });
  json list = json::array();
  for (const CheckpointEntry* e : entries) {
    json c = json::object();
    c["index"] = e->index;
    c["dir"] = e->dir;
    c["step_count"] = e->counters.step_count;
    c["epoch_count"] = e->counters.epoch_count;
    json counters = json::object();
    for (const auto& [k, v] : e->counters.extra) counters[k] = v;
    c["counters"] = counters;
    c["time"] = e->time;
    if (e->metric) {
      json m = json::object();
      m["name"] = e->metric->name;
      const double v = e->metric->value;
      if (std::isnan(v)) m["value"] = "NaN";
      else if (std::isinf(v)) m["value"] = v > 0 ? "Infinity" : "-Infinity";
      else m["value"] = v;
      c["metric"] = m;
    }
    json files = json::array();
    for (const auto& f : e->files) {
      json fj = json::object();
      fj["name"] = f.name;
      fj["size"] = f.size;
      fj["sha256"] = f.sha256;
      files.push_back(fj);
    }
    c["files"] = files;
    list.push_back(c);
  }
  json doc = json::object();
  doc["schema_version"] = kSchemaVersion;
  doc["checkpoints"] = list;
  return doc.dump(2) + "\n";
}

}  // namespace crucible::checkpoint::detail
