// Extended XYZ reader and writer. See include/crucible/data/extxyz.h.
//
// The reader is a hand parser (no regex, no iostream per value): the file is
// read in large blocks, split into lines, and numbers are parsed with
// std::from_chars. The comment-line grammar follows ASE 3.22's
// key_val_str_to_dict (quotes "...", '...', {...}, [...], backslash escapes,
// whitespace around '=', keys without '=' are boolean True flags).

#include "crucible/data/extxyz.h"

#include "crucible/common/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include <sys/stat.h>

namespace crucible {
namespace {

// ---------------------------------------------------------------------------
// Periodic table.

const std::array<std::string, 119>& symbol_table() {
  static const std::array<std::string, 119> table = {
      "X",  "H",  "He", "Li", "Be", "B",  "C",  "N",  "O",  "F",  "Ne", "Na", "Mg", "Al", "Si",
      "P",  "S",  "Cl", "Ar", "K",  "Ca", "Sc", "Ti", "V",  "Cr", "Mn", "Fe", "Co", "Ni", "Cu",
      "Zn", "Ga", "Ge", "As", "Se", "Br", "Kr", "Rb", "Sr", "Y",  "Zr", "Nb", "Mo", "Tc", "Ru",
      "Rh", "Pd", "Ag", "Cd", "In", "Sn", "Sb", "Te", "I",  "Xe", "Cs", "Ba", "La", "Ce", "Pr",
      "Nd", "Pm", "Sm", "Eu", "Gd", "Tb", "Dy", "Ho", "Er", "Tm", "Yb", "Lu", "Hf", "Ta", "W",
      "Re", "Os", "Ir", "Pt", "Au", "Hg", "Tl", "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac",
      "Th", "Pa", "U",  "Np", "Pu", "Am", "Cm", "Bk", "Cf", "Es", "Fm", "Md", "No", "Lr", "Rf",
      "Db", "Sg", "Bh", "Hs", "Mt", "Ds", "Rg", "Cn", "Nh", "Fl", "Mc", "Lv", "Ts", "Og"};
  return table;
}

// Lookup table keyed by the (capitalised) one- or two-letter symbol:
// index = (first - 'A') * 27 + (second ? second - 'a' + 1 : 0).
constexpr int kSymbolSlots = 26 * 27;

const std::array<uint8_t, kSymbolSlots>& symbol_lookup() {
  static const std::array<uint8_t, kSymbolSlots> lookup = [] {
    std::array<uint8_t, kSymbolSlots> t{};
    const auto& table = symbol_table();
    for (size_t z = 1; z < table.size(); ++z) {
      const std::string& s = table[z];
      const int slot = (s[0] - 'A') * 27 + (s.size() > 1 ? s[1] - 'a' + 1 : 0);
      t[static_cast<size_t>(slot)] = static_cast<uint8_t>(z);
    }
    return t;
  }();
  return lookup;
}

// Atomic number of a symbol, capitalised as ASE does ("TI", "ti" -> Ti);
// 0 when unknown.
int64_t lookup_symbol(std::string_view s) {
  if (s.empty() || s.size() > 2) return 0;
  auto upper = [](char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c; };
  auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; };
  const char c0 = upper(s[0]);
  if (c0 < 'A' || c0 > 'Z') return 0;
  int slot = (c0 - 'A') * 27;
  if (s.size() == 2) {
    const char c1 = lower(s[1]);
    if (c1 < 'a' || c1 > 'z') return 0;
    slot += c1 - 'a' + 1;
  }
  return symbol_lookup()[static_cast<size_t>(slot)];
}

// ---------------------------------------------------------------------------
// Small string helpers.

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Parses a whole token as a double (a leading '+' is accepted, as in Python).
bool parse_double(std::string_view s, double& out) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end;
}

bool parse_int(std::string_view s, int64_t& out) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end;
}

// Splits a header value on whitespace and commas (as ASE does for arrays).
std::vector<std::string_view> split_list(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (is_space(s[i]) || s[i] == ',')) ++i;
    size_t j = i;
    while (j < s.size() && !is_space(s[j]) && s[j] != ',') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// Shortens a value for an error message; bytes that are not printable ASCII
// are shown as \xNN (binary garbage must not reach the terminal raw).
std::string quote_for_message(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out = "'";
  for (size_t i = 0; i < std::min(s.size(), kMax); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > kMax) out += "...";
  out += "'";
  return out;
}

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return out;
}

[[noreturn]] void fail(const std::string& path, int64_t line, const std::string& what) {
  throw DataError(path + ":" + std::to_string(line) + ": " + what);
}

// ---------------------------------------------------------------------------
// Buffered line reader: yields lines (without '\n' / "\r\n") as string_views
// valid until the next call.

class LineReader {
 public:
  /// Reads the file at `path`.
  explicit LineReader(const std::string& path) : path_(path) {
    // Only regular files: a FIFO would block forever, /dev/zero never ends.
    struct stat pre {};
    if (::stat(path.c_str(), &pre) == 0 && !S_ISREG(pre.st_mode)) {
      throw DataError(path + ": must be a regular file, got " +
                      (S_ISDIR(pre.st_mode)    ? "a directory"
                       : S_ISFIFO(pre.st_mode) ? "a FIFO (named pipe)"
                       : S_ISCHR(pre.st_mode) || S_ISBLK(pre.st_mode) ? "a device"
                                                                       : "a special file"));
    }
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      throw DataError(path + ": file must be readable, got " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(::fileno(file_), &st) == 0 && S_ISREG(st.st_mode)) {
      size_ = static_cast<uint64_t>(st.st_size);
    } else {
      size_ = UINT64_MAX;  // a pipe or device: its size is unknown
    }
    buffer_.resize(kChunk);
  }
  /// Reads `text` (kept alive by the caller); `name` is used in messages.
  LineReader(std::string_view text, const std::string& name) : path_(name), memory_(true) {
    buffer_.assign(text.begin(), text.end());
    end_ = buffer_.size();
    size_ = read_ = text.size();
    eof_ = true;
  }
  ~LineReader() {
    if (file_ != nullptr) std::fclose(file_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  /// Bytes of the input after the lines returned so far (an upper bound:
  /// UINT64_MAX when the input is not a regular file).
  uint64_t bytes_left() const {
    if (size_ == UINT64_MAX) return UINT64_MAX;
    const uint64_t consumed = read_ - (end_ - begin_);
    return consumed >= size_ ? 0 : size_ - consumed;
  }

  /// Next line, or false at end of file. line_number() is then its 1-based number.
  bool next(std::string_view& line) {
    while (true) {
      const char* start = buffer_.data() + begin_;
      // (memchr must not see the null data() of an empty buffer.)
      const void* nl = begin_ < end_ ? std::memchr(start, '\n', end_ - begin_) : nullptr;
      if (nl != nullptr) {
        const size_t len = static_cast<const char*>(nl) - start;
        line = std::string_view(start, len);
        begin_ += len + 1;
        ++line_number_;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        return true;
      }
      if (eof_) {
        if (begin_ == end_) return false;
        line = std::string_view(start, end_ - begin_);
        begin_ = end_;
        ++line_number_;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        return true;
      }
      fill();
    }
  }

  int64_t line_number() const { return line_number_; }

 private:
  static constexpr size_t kChunk = size_t{1} << 20;

  void fill() {
    // Move the partial line to the front, grow if one line exceeds the buffer.
    const size_t rest = end_ - begin_;
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, rest);
      begin_ = 0;
      end_ = rest;
    }
    if (buffer_.size() - end_ < kChunk / 2) buffer_.resize(buffer_.size() * 2);
    const size_t got = memory_ ? 0 : std::fread(buffer_.data() + end_, 1, buffer_.size() - end_, file_);
    if (got == 0) {
      if (std::ferror(file_)) {
        throw DataError(path_ + ":" + std::to_string(line_number_ + 1) +
                        ": file must be readable, got a read error");
      }
      eof_ = true;
    }
    end_ += got;
    read_ += got;
  }

  std::string path_;
  bool memory_ = false;
  std::FILE* file_ = nullptr;
  uint64_t size_ = 0;   // bytes in the input
  uint64_t read_ = 0;   // bytes read into the buffer so far (file input)
  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
};

// ---------------------------------------------------------------------------
// Comment line: key=value pairs, parsed as ASE's key_val_str_to_dict.

struct KeyValue {
  std::string key;
  std::string value;
  bool has_value = false;  // false for a bare flag (ASE: True)
};

std::vector<KeyValue> parse_comment(std::string_view line) {
  std::vector<KeyValue> pairs;
  pairs.emplace_back();
  bool in_value = false;      // the current pair has seen '='
  bool part_started = false;  // current key / value part has content or quotes
  char closer = 0;            // expected closing delimiter while quoted
  bool escaped = false;

  auto append = [&](char c) {
    if (in_value) {
      pairs.back().value += c;
    } else {
      pairs.back().key += c;
    }
    part_started = true;
  };

  for (char c : trim(line)) {
    if (escaped) {
      append(c);
      escaped = false;
    } else if (c == '\\') {
      escaped = true;
    } else if (closer != 0) {
      if (c == closer) {
        closer = 0;
      } else {
        append(c);
      }
    } else if (c == '"' || c == '\'' || c == '{' || c == '[') {
      closer = c == '{' ? '}' : c == '[' ? ']' : c;
      part_started = true;
    } else if (is_space(c)) {
      if (!part_started) continue;
      pairs.emplace_back();
      in_value = false;
      part_started = false;
    } else if (c == '=') {
      if (!in_value && !part_started && pairs.size() > 1) {
        // "key =value": the '=' belongs to the previous pair.
        pairs.pop_back();
        in_value = pairs.back().has_value;
      }
      if (in_value) {
        pairs.back().value += '=';  // "a=b=c" -> value "b=c", as ASE
      }
      in_value = true;
      pairs.back().has_value = true;
      part_started = false;
    } else {
      append(c);
    }
  }
  if (!pairs.empty() && pairs.back().key.empty() && !pairs.back().has_value) pairs.pop_back();
  return pairs;
}

// ---------------------------------------------------------------------------
// Properties=name:type:count:...

// Most values one atom line may declare (Properties counts summed): far
// above any real file, low enough that the per-column tables stay small.
constexpr int64_t kMaxColumns = 65536;

enum class ColumnKind : uint8_t { kSpecies, kZ, kPos, kForce, kReal, kInt, kOther };

struct Column {
  std::string name;
  char type = 'R';
  int64_t count = 1;
};

struct Layout {
  std::string properties;  // the raw Properties value (cache key)
  std::vector<Column> columns;
  std::vector<ColumnKind> kinds;   // one per token of an atom line
  std::vector<int> component;      // 0..2 for pos / force tokens
  int64_t total = 0;               // tokens per atom line
  bool has_species = false;
  bool has_z = false;
  bool has_forces = false;
  std::string description;         // "species:S:1 pos:R:3 force:R:3"
};

Layout parse_properties(const std::string& props, const ExtxyzOptions& options,
                        const std::string& path, int64_t line) {
  Layout layout;
  layout.properties = props;
  std::vector<std::string_view> fields;
  {
    std::string_view s(props);
    size_t i = 0;
    while (true) {
      const size_t j = s.find(':', i);
      fields.push_back(s.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
      if (j == std::string_view::npos) break;
      i = j + 1;
    }
  }
  int64_t declared = 0;  // values per atom line so far
  if (fields.size() % 3 != 0) {
    fail(path, line, "Properties must be name:type:count triples, got " + quote_for_message(props));
  }
  for (size_t i = 0; i < fields.size(); i += 3) {
    Column col;
    col.name = std::string(fields[i]);
    if (fields[i + 1].size() != 1 || std::string_view("RISL").find(fields[i + 1][0]) == std::string_view::npos) {
      fail(path, line, "Properties type of column " + col.name + " must be one of R, I, S, L, got " +
                           quote_for_message(fields[i + 1]));
    }
    col.type = fields[i + 1][0];
    if (!parse_int(fields[i + 2], col.count) || col.count < 1) {
      fail(path, line, "Properties count of column " + col.name + " must be a positive integer, got " +
                           quote_for_message(fields[i + 2]));
    }
    if (col.count > kMaxColumns - declared) {
      fail(path, line, "Properties must declare at most " + std::to_string(kMaxColumns) +
                           " values per atom line, got more at column " + col.name + " (count " +
                           std::to_string(col.count) + ")");
    }
    declared += col.count;
    layout.columns.push_back(col);
  }

  // Which column holds the forces.
  std::string forces_name = options.forces_key;
  if (forces_name.empty()) {
    forces_name = "forces";
    bool has_forces = false;
    for (const auto& c : layout.columns) has_forces |= c.name == "forces";
    if (!has_forces) forces_name = "force";
  }

  bool has_pos = false;
  for (const auto& col : layout.columns) {
    const std::string spec = col.name + ":" + col.type + ":" + std::to_string(col.count);
    if (!layout.description.empty()) layout.description += ' ';
    layout.description += spec;
    auto require = [&](char type, int64_t count) {
      if (col.type != type || col.count != count) {
        fail(path, line, "Properties column " + col.name + " must be " + col.name + ":" + type + ":" +
                             std::to_string(count) + ", got " + spec);
      }
    };
    ColumnKind kind = col.type == 'R' ? ColumnKind::kReal : col.type == 'I' ? ColumnKind::kInt : ColumnKind::kOther;
    bool duplicate = false;
    if (col.name == "species") {
      require('S', 1);
      duplicate = layout.has_species;
      layout.has_species = true;
      kind = ColumnKind::kSpecies;
    } else if (col.name == "Z") {
      require('I', 1);
      duplicate = layout.has_z;
      layout.has_z = true;
      kind = ColumnKind::kZ;
    } else if (col.name == "pos") {
      require('R', 3);
      duplicate = has_pos;
      has_pos = true;
      kind = ColumnKind::kPos;
    } else if (col.name == forces_name) {
      require('R', 3);
      duplicate = layout.has_forces;
      layout.has_forces = true;
      kind = ColumnKind::kForce;
    }
    if (duplicate) {
      fail(path, line, "Properties column " + col.name + " must appear once, got it twice in " +
                           quote_for_message(props));
    }
    for (int64_t k = 0; k < col.count; ++k) {
      layout.kinds.push_back(kind);
      layout.component.push_back(static_cast<int>(k));
    }
    layout.total += col.count;
  }
  if (!has_pos) {
    fail(path, line, "Properties must contain pos:R:3, got " + quote_for_message(props));
  }
  if (!layout.has_species && !layout.has_z) {
    fail(path, line, "Properties must contain species:S:1 or Z:I:1, got " + quote_for_message(props));
  }
  return layout;
}

// Name of the Properties column that token `t` of an atom line belongs to.
const std::string& column_name(const Layout& layout, size_t t) {
  size_t c = 0;
  int64_t first = 0;
  while (first + layout.columns[c].count <= static_cast<int64_t>(t)) first += layout.columns[c++].count;
  return layout.columns[c].name;
}

// ---------------------------------------------------------------------------
// Header values.

std::vector<double> parse_numbers(const KeyValue& kv, const std::string& path, int64_t line) {
  std::vector<double> out;
  for (std::string_view tok : split_list(kv.value)) {
    double v = 0.0;
    if (!parse_double(tok, v)) {
      fail(path, line, kv.key + " must be numbers, got " + quote_for_message(kv.value));
    }
    out.push_back(v);
  }
  return out;
}

double parse_scalar(const KeyValue& kv, const std::string& path, int64_t line) {
  double v = 0.0;
  if (!kv.has_value || !parse_double(trim(kv.value), v)) {
    fail(path, line, kv.key + " must be a number, got " + quote_for_message(kv.has_value ? kv.value : "(no value)"));
  }
  if (!std::isfinite(v)) fail(path, line, kv.key + " must be a finite number, got " + quote_for_message(kv.value));
  return v;
}

// Header numbers that must all be finite (Lattice, stress, virial).
void require_finite(const KeyValue& kv, const std::vector<double>& v, const std::string& path, int64_t line) {
  for (double x : v) {
    if (!std::isfinite(x)) {
      fail(path, line, kv.key + " must be finite numbers, got " + quote_for_message(kv.value));
    }
  }
}

bool parse_bool_token(std::string_view t, bool& out) {
  if (t == "T" || t == "True" || t == "true" || t == "t" || t == "1") {
    out = true;
    return true;
  }
  if (t == "F" || t == "False" || t == "false" || t == "f" || t == "0") {
    out = false;
    return true;
  }
  return false;
}

std::array<bool, 3> parse_pbc(const KeyValue& kv, const std::string& path, int64_t line) {
  if (!kv.has_value) return {true, true, true};  // bare "pbc" flag = True
  const auto toks = split_list(kv.value);
  std::array<bool, 3> pbc{false, false, false};
  bool ok = toks.size() == 3 || toks.size() == 1;
  for (size_t i = 0; ok && i < toks.size(); ++i) ok = parse_bool_token(toks[i], pbc[i]);
  if (!ok) {
    fail(path, line, "pbc must be 3 values of T or F, got " + quote_for_message(kv.value));
  }
  if (toks.size() == 1) pbc[1] = pbc[2] = pbc[0];
  return pbc;
}

// 6 Voigt (xx yy zz yz xz xy) or 9 row-major values -> 3x3 row-major.
std::array<double, 9> to_3x3(const KeyValue& kv, const std::string& path, int64_t line) {
  const auto v = parse_numbers(kv, path, line);
  require_finite(kv, v, path, line);
  if (v.size() == 9) {
    std::array<double, 9> m{};
    for (size_t i = 0; i < 9; ++i) m[i] = v[i];
    return m;
  }
  if (v.size() == 6) {
    return {v[0], v[5], v[4], v[5], v[1], v[3], v[4], v[3], v[2]};
  }
  fail(path, line, kv.key + " must be 6 (Voigt) or 9 numbers, got " + std::to_string(v.size()));
}

at::Tensor tensor_3x3(const std::array<double, 9>& m, double scale) {
  at::Tensor t = at::empty({3, 3}, at::TensorOptions().dtype(at::kDouble));
  double* p = t.data_ptr<double>();
  for (size_t i = 0; i < 9; ++i) p[i] = m[i] * scale;
  return t;
}

double det3(const std::array<double, 9>& c) {
  return c[0] * (c[4] * c[8] - c[5] * c[7]) - c[1] * (c[3] * c[8] - c[5] * c[6]) +
         c[2] * (c[3] * c[7] - c[4] * c[6]);
}

// Tokenises an atom line into at most `max` whitespace-separated fields;
// returns the total number of fields.
int64_t split_fields(std::string_view line, std::vector<std::string_view>& out, size_t max) {
  out.clear();
  int64_t n = 0;
  const char* p = line.data();
  const char* end = p + line.size();
  while (true) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
    if (p >= end) break;
    const char* q = p;
    while (q < end && *q != ' ' && *q != '\t' && *q != '\r') ++q;
    if (out.size() < max) out.emplace_back(p, static_cast<size_t>(q - p));
    ++n;
    p = q;
  }
  return n;
}

// ---------------------------------------------------------------------------
// Writer helpers.

void append_double(std::string& out, double v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, 17);
  (void)ec;
  out.append(buf, ptr);
}

// Quotes a header key or value when ASE (and our reader) needs it.
std::string escape_value(const std::string& s) {
  bool needs = s.empty();
  for (char c : s) {
    if (is_space(c) || c == '"' || c == '\'' || c == '{' || c == '}' || c == '[' || c == ']' || c == '\\' ||
        c == '=' || c == ',') {
      needs = true;
      break;
    }
  }
  if (!needs) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  out += '"';
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

int64_t atomic_number(const std::string& symbol) {
  const int64_t z = lookup_symbol(symbol);
  if (z == 0) throw DataError("chemical symbol must be a known element, got " + quote_for_message(symbol));
  return z;
}

const std::string& chemical_symbol(int64_t z) {
  if (z < 1 || z > 118) {
    throw DataError("atomic number must be in 1..118, got " + std::to_string(z));
  }
  return symbol_table()[static_cast<size_t>(z)];
}

std::string element_symbols(const std::vector<int64_t>& zs, const std::string& separator) {
  std::string out;
  for (int64_t z : zs) out += (out.empty() ? "" : separator) + chemical_symbol(z);
  return out;
}

namespace {

std::vector<Structure> read_frames(LineReader& reader, const std::string& path, const ExtxyzOptions& options) {
  std::vector<Structure> frames;
  int64_t atoms_read = 0;
  std::string_view line;
  Layout layout;
  std::vector<std::string_view> fields;
  std::vector<double> pos_buf, force_buf;
  std::vector<int64_t> z_buf;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const auto i64 = at::TensorOptions().dtype(at::kLong);

  while (reader.next(line)) {
    const std::string_view count_text = trim(line);
    if (count_text.empty()) continue;  // blank lines between / after frames
    const int64_t count_line = reader.line_number();
    int64_t natoms = 0;
    if (!parse_int(count_text, natoms) || natoms < 0) {
      std::string what = "atom count must be a non-negative integer, got " + quote_for_message(count_text);
      if (!frames.empty()) {
        what += " (does the atom count of the frame at " + frames.back().source +
                " match its number of atom lines?)";
      }
      fail(path, count_line, what);
    }

    // Comment line.
    if (!reader.next(line)) {
      fail(path, count_line, "frame must have a comment line after the atom count, got end of file");
    }
    const int64_t comment_line = reader.line_number();
    Structure s;
    s.source = path + ":" + std::to_string(comment_line);

    std::string properties = "species:S:1:pos:R:3";  // ASE default
    const KeyValue* lattice = nullptr;
    const KeyValue* pbc = nullptr;
    const KeyValue* stress = nullptr;
    const KeyValue* virial = nullptr;
    const std::vector<KeyValue> pairs = parse_comment(line);
    // A key given twice would be last-wins silently (issue 15): refuse it.
    // Lattice, Properties and pbc are matched case-insensitively, as read.
    std::set<std::string> seen_keys;
    for (const KeyValue& kv : pairs) {
      const std::string low = lower_ascii(kv.key);
      const bool special = low == "lattice" || low == "properties" || low == "pbc";
      if (!seen_keys.insert(special ? low : kv.key).second) {
        fail(path, comment_line, "header key " + quote_for_message(kv.key) +
                                     " must appear once, got it twice (keep one of them)");
      }
    }
    for (const KeyValue& kv : pairs) {
      const std::string low = lower_ascii(kv.key);
      if (low == "lattice") {
        lattice = &kv;
      } else if (low == "properties") {
        properties = kv.value;
      } else if (low == "pbc") {
        pbc = &kv;
      } else if (kv.key == options.energy_key) {
        s.energy = parse_scalar(kv, path, comment_line) * options.energy_unit;
      } else if (kv.key == options.stress_key) {
        stress = &kv;
      } else if (kv.key == options.virial_key) {
        virial = &kv;
      } else if (kv.key == "config_type") {
        s.config_type = kv.has_value ? kv.value : std::string("T");
      } else if (kv.key == "config_weight") {
        s.weight = parse_scalar(kv, path, comment_line);
      } else if (kv.key == "config_energy_weight") {
        s.energy_weight = parse_scalar(kv, path, comment_line);
      } else if (kv.key == "config_forces_weight") {
        s.forces_weight = parse_scalar(kv, path, comment_line);
      } else if (kv.key == "config_stress_weight") {
        s.stress_weight = parse_scalar(kv, path, comment_line);
      } else {
        s.info[kv.key] = kv.has_value ? kv.value : std::string("T");
      }
    }

    std::array<double, 9> cell{};
    if (lattice != nullptr) {
      const auto v = parse_numbers(*lattice, path, comment_line);
      if (v.size() != 9) {
        fail(path, comment_line, "Lattice must be 9 numbers, got " + std::to_string(v.size()));
      }
      require_finite(*lattice, v, path, comment_line);
      for (size_t i = 0; i < 9; ++i) cell[i] = v[i];
    }
    s.cell = tensor_3x3(cell, 1.0);
    if (pbc != nullptr) {
      s.pbc = parse_pbc(*pbc, path, comment_line);
    } else {
      const bool p = lattice != nullptr;
      s.pbc = {p, p, p};
    }
    if (stress != nullptr) {
      s.stress = tensor_3x3(to_3x3(*stress, path, comment_line), options.stress_unit);
    }
    if (virial != nullptr) {
      if (s.stress) {
        s.info[virial->key] = virial->value;  // an explicit stress wins; keep the virial text
      } else {
        const auto w = to_3x3(*virial, path, comment_line);
        const double volume = std::abs(det3(cell));
        if (lattice == nullptr || !(volume > 0.0)) {
          fail(path, comment_line,
               virial->key + " must come with a Lattice of non-zero volume (stress = -virial / volume), got " +
                   (lattice == nullptr ? std::string("no Lattice") : std::string("volume 0")));
        }
        s.stress = tensor_3x3(w, -options.energy_unit / volume);
      }
    }

    if (layout.columns.empty() || properties != layout.properties) {
      layout = parse_properties(properties, options, path, comment_line);
    }
    for (const auto& col : layout.columns) s.columns.push_back(col.name);

    // The atom count must fit in the bytes that are left: every atom line has
    // `total` tokens of at least one character, each followed by a space or
    // the newline. Checked before anything is sized from the count.
    const uint64_t per_line = 2 * static_cast<uint64_t>(layout.total);
    const uint64_t left = reader.bytes_left();
    if (natoms > 0 && static_cast<uint64_t>(natoms) > (left == UINT64_MAX ? left : left + 1) / per_line) {
      fail(path, count_line,
           "frame must have " + std::to_string(natoms) + " atom lines after the comment line, got only " +
               std::to_string(left) + " bytes before end of file, too few for them (" +
               std::to_string(layout.total) + " columns need at least " + std::to_string(per_line) +
               " bytes per line; truncated file or wrong atom count?)");
    }

    // Atom lines.
    // Grown per atom line (not sized from the count, which may be corrupt),
    // copied into tensors once the frame is complete.
    const size_t reserve = static_cast<size_t>(std::min<int64_t>(natoms, int64_t{1} << 20));
    pos_buf.clear();
    z_buf.clear();
    force_buf.clear();
    pos_buf.reserve(reserve * 3);
    z_buf.reserve(reserve);
    if (layout.has_forces) force_buf.reserve(reserve * 3);
    const bool use_z = layout.has_z;  // Z wins over species, as in ASE
    const size_t total = static_cast<size_t>(layout.total);

    for (int64_t a = 0; a < natoms; ++a) {
      if (!reader.next(line)) {
        fail(path, count_line,
             "frame must have " + std::to_string(natoms) + " atom lines after the comment line, got " +
                 std::to_string(a) + " before end of file");
      }
      const int64_t ln = reader.line_number();
      const int64_t n = split_fields(line, fields, total);
      if (n != layout.total) {
        std::string what = "atom line must have " + std::to_string(layout.total) + " columns (" +
                           layout.description + "), got " + std::to_string(n);
        int64_t dummy = 0;
        if (n == 0 || (n == 1 && parse_int(fields[0], dummy))) {
          what += " (does the atom count " + std::to_string(natoms) + " on line " + std::to_string(count_line) +
                  " match the number of atom lines?)";
        }
        fail(path, ln, what);
      }
      pos_buf.resize(pos_buf.size() + 3);
      z_buf.resize(z_buf.size() + 1);
      if (layout.has_forces) force_buf.resize(force_buf.size() + 3);
      double* pos_p = pos_buf.data() + a * 3;
      int64_t* z_p = z_buf.data() + a;
      double* f_p = layout.has_forces ? force_buf.data() + a * 3 : nullptr;
      for (size_t t = 0; t < total; ++t) {
        const std::string_view tok = fields[t];
        switch (layout.kinds[t]) {
          case ColumnKind::kSpecies: {
            if (use_z) break;
            const int64_t z = lookup_symbol(tok);
            if (z == 0) fail(path, ln, "species must be a chemical symbol, got " + quote_for_message(tok));
            *z_p = z;
            break;
          }
          case ColumnKind::kZ: {
            int64_t z = 0;
            if (!parse_int(tok, z) || z < 1 || z > 118) {
              fail(path, ln, "Z must be an atomic number in 1..118, got " + quote_for_message(tok));
            }
            *z_p = z;
            break;
          }
          case ColumnKind::kPos:
          case ColumnKind::kForce:
          case ColumnKind::kReal: {
            double v = 0.0;
            if (!parse_double(tok, v)) {
              fail(path, ln, "column " + std::to_string(t + 1) + " (" + column_name(layout, t) +
                                 ") must be a number, got " + quote_for_message(tok));
            }
            if (layout.kinds[t] != ColumnKind::kReal && !std::isfinite(v)) {
              fail(path, ln, "column " + std::to_string(t + 1) + " (" + column_name(layout, t) +
                                 ") must be a finite number, got " + quote_for_message(tok));
            }
            if (layout.kinds[t] == ColumnKind::kPos) {
              pos_p[layout.component[t]] = v;
            } else if (layout.kinds[t] == ColumnKind::kForce) {
              f_p[layout.component[t]] = v * options.forces_unit;
            }
            break;
          }
          case ColumnKind::kInt: {
            int64_t v = 0;
            if (!parse_int(tok, v)) {
              fail(path, ln, "column " + std::to_string(t + 1) + " (" + column_name(layout, t) +
                                 ") must be an integer, got " + quote_for_message(tok));
            }
            break;
          }
          case ColumnKind::kOther:
            break;
        }
      }
    }
    s.positions = at::empty({natoms, 3}, f64);
    s.atomic_numbers = at::empty({natoms}, i64);
    std::copy(pos_buf.begin(), pos_buf.end(), s.positions.data_ptr<double>());
    std::copy(z_buf.begin(), z_buf.end(), s.atomic_numbers.data_ptr<int64_t>());
    if (layout.has_forces) {
      at::Tensor forces = at::empty({natoms, 3}, f64);
      std::copy(force_buf.begin(), force_buf.end(), forces.data_ptr<double>());
      s.forces = forces;
    }
    frames.push_back(std::move(s));
    atoms_read += natoms;
    if ((frames.size() & 1023) == 0) {  // issue 47: bounded before the data outgrows the memory
      check_structures_memory(static_cast<int64_t>(frames.size()), atoms_read, options.memory_budget_bytes,
                              frames.back().source);
    }
  }
  check_structures_memory(static_cast<int64_t>(frames.size()), atoms_read, options.memory_budget_bytes, path);
  return frames;
}

}  // namespace

std::vector<Structure> read_extxyz(const std::string& path, const ExtxyzOptions& options) {
  LineReader reader(path);
  return read_frames(reader, path, options);
}

std::vector<Structure> read_extxyz_text(std::string_view text, const std::string& name,
                                        const ExtxyzOptions& options) {
  LineReader reader(text, name);
  return read_frames(reader, name, options);
}

void write_extxyz(const std::string& path, const std::vector<Structure>& structures) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    throw DataError(path + ": file must be writable, got " + std::strerror(errno));
  }
  auto fail_write = [&](const std::string& what) {
    std::fclose(file);
    throw DataError(what);
  };

  std::string out;
  for (size_t f = 0; f < structures.size(); ++f) {
    const Structure& s = structures[f];
    const std::string where = "structure " + std::to_string(f) + (s.source.empty() ? "" : " (" + s.source + ")");
    if (!s.positions.defined() || s.positions.dim() != 2 || s.positions.size(1) != 3) {
      fail_write(where + ": positions must be a [N,3] tensor, got " +
                 (s.positions.defined() ? "shape " + std::string(c10::str(s.positions.sizes())) : "undefined"));
    }
    const int64_t n = s.positions.size(0);
    if (!s.atomic_numbers.defined() || s.atomic_numbers.dim() != 1 || s.atomic_numbers.size(0) != n) {
      fail_write(where + ": atomic_numbers must be [" + std::to_string(n) + "], got another shape");
    }
    const at::Tensor pos = s.positions.to(at::kCPU, at::kDouble).contiguous();
    const at::Tensor z = s.atomic_numbers.to(at::kCPU, at::kLong).contiguous();
    at::Tensor forces;
    if (s.forces) {
      if (!s.forces->defined() || s.forces->dim() != 2 || s.forces->size(0) != n || s.forces->size(1) != 3) {
        fail_write(where + ": forces must be [" + std::to_string(n) + ",3], got another shape");
      }
      forces = s.forces->to(at::kCPU, at::kDouble).contiguous();
    }
    const double* pp = pos.data_ptr<double>();
    const int64_t* zp = z.data_ptr<int64_t>();
    const double* fp = forces.defined() ? forces.data_ptr<double>() : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      if (zp[i] < 1 || zp[i] > 118) {
        fail_write(where + ": atomic number must be in 1..118, got " + std::to_string(zp[i]));
      }
    }

    out.clear();
    out += std::to_string(n);
    out += '\n';

    // Comment line.
    std::array<double, 9> cell{};
    if (s.cell.defined()) {
      if (s.cell.numel() != 9) fail_write(where + ": cell must be [3,3], got another shape");
      const at::Tensor c = s.cell.to(at::kCPU, at::kDouble).contiguous();
      for (size_t i = 0; i < 9; ++i) cell[i] = c.data_ptr<double>()[i];
    }
    bool any_cell = false;
    for (double v : cell) any_cell |= v != 0.0;
    if (any_cell) {
      out += "Lattice=\"";
      for (size_t i = 0; i < 9; ++i) {
        if (i) out += ' ';
        append_double(out, cell[i]);
      }
      out += "\" ";
    }
    out += "Properties=species:S:1:pos:R:3";
    if (fp != nullptr) out += ":forces:R:3";
    std::vector<at::Tensor> extra;  // [N, k] float64 each
    for (const auto& [name, t] : s.arrays) {
      const at::Tensor a = t.to(at::kCPU, at::kDouble).reshape({n, -1}).contiguous();
      out += ":" + name + ":R:" + std::to_string(a.size(1));
      extra.push_back(a);
    }
    if (s.energy) {
      out += " energy=";
      append_double(out, *s.energy);
    }
    if (s.stress) {
      if (!s.stress->defined() || s.stress->numel() != 9) fail_write(where + ": stress must be [3,3], got another shape");
      const at::Tensor st = s.stress->to(at::kCPU, at::kDouble).contiguous();
      out += " stress=\"";
      for (size_t i = 0; i < 9; ++i) {
        if (i) out += ' ';
        append_double(out, st.data_ptr<double>()[i]);
      }
      out += '"';
    }
    out += " pbc=\"";
    out += s.pbc[0] ? 'T' : 'F';
    out += s.pbc[1] ? " T" : " F";
    out += s.pbc[2] ? " T" : " F";
    out += "\" config_type=";
    out += escape_value(s.config_type);
    const std::pair<const char*, double> weights[] = {{"config_weight", s.weight},
                                                      {"config_energy_weight", s.energy_weight},
                                                      {"config_forces_weight", s.forces_weight},
                                                      {"config_stress_weight", s.stress_weight}};
    for (const auto& [key, w] : weights) {
      if (w != 1.0) {
        out += ' ';
        out += key;
        out += '=';
        append_double(out, w);
      }
    }
    for (const auto& [key, value] : s.info) {
      const std::string low = lower_ascii(key);
      if (key.empty() || low == "lattice" || low == "properties" || low == "pbc" || key == "energy" ||
          key == "stress" || key == "config_type" || key == "config_weight" || key == "config_energy_weight" ||
          key == "config_forces_weight" || key == "config_stress_weight") {
        continue;  // written above from the Structure's own fields
      }
      out += ' ';
      out += escape_value(key);
      out += '=';
      out += escape_value(value);
    }
    out += '\n';

    // Atom lines.
    for (int64_t i = 0; i < n; ++i) {
      out += symbol_table()[static_cast<size_t>(zp[i])];
      for (int k = 0; k < 3; ++k) {
        out += ' ';
        append_double(out, pp[i * 3 + k]);
      }
      if (fp != nullptr) {
        for (int k = 0; k < 3; ++k) {
          out += ' ';
          append_double(out, fp[i * 3 + k]);
        }
      }
      for (const auto& a : extra) {
        const int64_t k = a.size(1);
        const double* ap = a.data_ptr<double>() + i * k;
        for (int64_t c = 0; c < k; ++c) {
          out += ' ';
          append_double(out, ap[c]);
        }
      }
      out += '\n';
      if (out.size() > (size_t{1} << 20)) {
        if (std::fwrite(out.data(), 1, out.size(), file) != out.size()) {
          fail_write(path + ": file must be writable, got a write error");
        }
        out.clear();
      }
    }
    if (!out.empty() && std::fwrite(out.data(), 1, out.size(), file) != out.size()) {
      fail_write(path + ": file must be writable, got a write error");
    }
  }
  if (std::fclose(file) != 0) {
    throw DataError(path + ": file must be writable, got an error on close");
  }
}

void check_structures_memory(int64_t frames, int64_t atoms, double budget_bytes, const std::string& where) {
  const double bytes = structures_bytes(frames, atoms);
  if (budget_bytes <= 0 || bytes <= budget_bytes) return;
  throw DataError(fmt::format("{}: the {} structures read so far ({} atoms) would hold about {:.2f} GB in memory "
                              "(4 KiB a structure + 56 B an atom), more than the {:.2f} GB available; train on a "
                              "part of the file or on a machine with more memory",
                              where, frames, atoms, bytes / 1e9, budget_bytes / 1e9));
}

}  // namespace crucible
