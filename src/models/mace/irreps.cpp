// Irreps parsing and printing. See include/crucible/models/mace/irreps.h.

#include "crucible/models/mace/irreps.h"

#include "crucible/common/error.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace crucible::mace {

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

/// Parses a non-negative decimal integer that fills `s` exactly.
bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 12) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && out >= 0;
}

}  // namespace

std::string Irrep::to_string() const { return std::to_string(l) + (parity > 0 ? "e" : "o"); }

Irreps Irreps::parse(const std::string& text, int max_l) {
  std::vector<MulIrrep> terms;
  const std::string all = trim(text);
  if (all.empty()) return Irreps{};
  size_t start = 0;
  while (start <= all.size()) {
    const size_t plus = all.find('+', start);
    const std::string term = trim(all.substr(start, plus == std::string::npos ? std::string::npos : plus - start));
    auto fail = [&](const std::string& why) {
      throw ConfigError("irreps '" + text + "': term '" + term + "' must be [<mul>x]<l><e|o> with mul >= 1 and l in 0.." +
                        std::to_string(max_l) + " (e.g. 128x0e+128x1o), got " + why);
    };
    if (term.empty()) fail("an empty term");
    int64_t mul = 1;
    std::string rest = term;
    const size_t x = term.find('x');
    if (x != std::string::npos) {
      if (!parse_int(term.substr(0, x), mul) || mul < 1) fail("multiplicity '" + term.substr(0, x) + "'");
      rest = term.substr(x + 1);
    }
    if (rest.size() < 2) fail("no <l><e|o>");
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(rest.back())));
    if (p != 'e' && p != 'o') fail("parity '" + rest.substr(rest.size() - 1) + "' (e or o)");
    int64_t l = 0;
    if (!parse_int(rest.substr(0, rest.size() - 1), l)) fail("l '" + rest.substr(0, rest.size() - 1) + "'");
    if (l > max_l) fail("l = " + std::to_string(l));
    terms.push_back({mul, Irrep{static_cast<int>(l), p == 'e' ? 1 : -1}});
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return Irreps(std::move(terms));
}

std::string Irreps::to_string() const {
  std::string out;
  for (const auto& t : terms_) {
    if (!out.empty()) out += "+";
    out += std::to_string(t.mul) + "x" + t.irrep.to_string();
  }
  return out;
}

int64_t Irreps::dim() const {
  int64_t d = 0;
  for (const auto& t : terms_) d += t.dim();
  return d;
}

int64_t Irreps::num_irreps() const {
  int64_t n = 0;
  for (const auto& t : terms_) n += t.mul;
  return n;
}

int Irreps::lmax() const {
  int l = 0;
  for (const auto& t : terms_) l = std::max(l, t.irrep.l);
  return l;
}

std::vector<int64_t> Irreps::offsets() const {
  std::vector<int64_t> out{0};
  for (const auto& t : terms_) out.push_back(out.back() + t.dim());
  return out;
}

bool Irreps::operator==(const Irreps& o) const {
  if (terms_.size() != o.terms_.size()) return false;
  for (size_t i = 0; i < terms_.size(); ++i) {
    if (terms_[i].mul != o.terms_[i].mul || terms_[i].irrep != o.terms_[i].irrep) return false;
  }
  return true;
}

}  // namespace crucible::mace
