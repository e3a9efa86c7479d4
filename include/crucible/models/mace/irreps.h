#pragma once
// Irreducible representations of O(3) as MACE and e3nn write them:
// "128x0e+128x1o" = 128 scalars (l = 0, even parity) and 128 vectors
// (l = 1, odd parity). Issue 16.

#include <cstdint>
#include <string>
#include <vector>

namespace crucible::mace {

/// One irrep of O(3): angular momentum l >= 0 and parity p = +1 ("e") or
/// -1 ("o"). Dimension 2l + 1.
struct Irrep {
  int l = 0;
  int parity = 1;
  int64_t dim() const { return 2 * l + 1; }
  /// "0e", "1o", ...
  std::string to_string() const;
  bool operator==(const Irrep& o) const { return l == o.l && parity == o.parity; }
  bool operator!=(const Irrep& o) const { return !(*this == o); }
};

/// `mul` copies of one irrep: "32x1o".
struct MulIrrep {
  int64_t mul = 1;
  Irrep irrep;
  int64_t dim() const { return mul * irrep.dim(); }
};

/// A direct sum of irreps in the order written (not sorted or simplified,
/// as e3nn's Irreps). Feature tensors with these irreps have `dim()`
/// columns: for each term, `mul` blocks of 2l + 1 components (m = -l..l).
class Irreps {
 public:
  Irreps() = default;
  explicit Irreps(std::vector<MulIrrep> terms) : terms_(std::move(terms)) {}
  /// Parses "128x0e+128x1o", "0e + 2x1o", "1x2e" (a missing multiplicity is
  /// 1; spaces around '+' are allowed; "" is the empty sum). `max_l` bounds l.
  /// @throws ConfigError "irreps '<text>': term '<term>' must be
  ///   [<mul>x]<l><e|o> with mul >= 1 and l in 0..<max_l>, got ..." naming
  ///   the bad term.
  static Irreps parse(const std::string& text, int max_l = 3);
  /// The canonical text: "128x0e+128x1o" (every multiplicity written).
  std::string to_string() const;
  /// Σ mul · (2l + 1).
  int64_t dim() const;
  /// Σ mul.
  int64_t num_irreps() const;
  /// The largest l (0 for the empty sum).
  int lmax() const;
  /// Column offset of each term in a feature tensor; size() + 1 entries.
  std::vector<int64_t> offsets() const;
  const std::vector<MulIrrep>& terms() const { return terms_; }
  size_t size() const { return terms_.size(); }
  bool operator==(const Irreps& o) const;

 private:
  std::vector<MulIrrep> terms_;
};

}  // namespace crucible::mace
