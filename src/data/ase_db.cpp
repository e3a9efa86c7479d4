// ASE SQLite databases. See include/crucible/data/ase_db.h.

#include "crucible/data/ase_db.h"

#include "crucible/common/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <cstring>
#include <fstream>
#include <memory>

namespace crucible {

namespace {

struct Closer {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
  void operator()(sqlite3_stmt* st) const { sqlite3_finalize(st); }
};

/// A blob column as `count` values of T, or an error naming the row.
template <class T>
std::vector<T> blob(sqlite3_stmt* st, int col, int64_t count, const std::string& where, const char* name) {
  const int bytes = sqlite3_column_bytes(st, col);
  if (static_cast<int64_t>(bytes) != count * static_cast<int64_t>(sizeof(T))) {
    throw DataError(fmt::format("{}: {} must hold {} values ({} bytes), got {} bytes", where, name, count,
                                count * static_cast<int64_t>(sizeof(T)), bytes));
  }
  std::vector<T> out(static_cast<size_t>(count));
  if (count > 0) std::memcpy(out.data(), sqlite3_column_blob(st, col), static_cast<size_t>(bytes));
  return out;
}

at::Tensor doubles(const std::vector<double>& v, std::vector<int64_t> shape) {
  return at::tensor(v, at::kDouble).view(shape).clone();
}

}  // namespace

bool is_sqlite_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[16] = {};
  f.read(head, 16);
  return f && std::memcmp(head, "SQLite format 3", 16) == 0;
}

std::vector<Structure> read_ase_db(const std::string& path, const ExtxyzOptions& o) {
  if (!is_sqlite_file(path)) throw DataError(path + ": an ASE database must be an SQLite file, got other bytes");
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string msg = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    throw DataError(path + ": cannot open the SQLite database (" + msg + ")");
  }
  std::unique_ptr<sqlite3, Closer> db(raw);
  sqlite3_stmt* st_raw = nullptr;
  const char* sql =
      "SELECT id, numbers, positions, cell, pbc, energy, forces, stress, key_value_pairs, natoms FROM systems ORDER BY id";
  if (sqlite3_prepare_v2(db.get(), sql, -1, &st_raw, nullptr) != SQLITE_OK) {
    throw DataError(path + ": an ASE database needs the table 'systems' with ASE's columns (" +
                    std::string(sqlite3_errmsg(db.get())) + ")");
  }
  std::unique_ptr<sqlite3_stmt, Closer> st(st_raw);
  std::vector<Structure> out;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    const int64_t id = sqlite3_column_int64(st.get(), 0);
    const std::string where = fmt::format("{} id {}", path, id);
    const int64_t n = sqlite3_column_int64(st.get(), 9);
    if (n < 1 || n > (int64_t{1} << 30)) throw DataError(fmt::format("{}: natoms must be >= 1, got {}", where, n));
    Structure s;
    s.source = where;
    const std::vector<int32_t> numbers = blob<int32_t>(st.get(), 1, n, where, "numbers");
    std::vector<int64_t> z(numbers.begin(), numbers.end());
    for (int64_t v : z) {
      if (v < 1 || v > 118) throw DataError(fmt::format("{}: atomic numbers must be in 1..118, got {}", where, v));
    }
    s.atomic_numbers = at::tensor(z, at::kLong);
    s.positions = doubles(blob<double>(st.get(), 2, n * 3, where, "positions"), {n, 3});
    s.cell = sqlite3_column_type(st.get(), 3) == SQLITE_NULL ? at::zeros({3, 3}, at::kDouble)
                                                             : doubles(blob<double>(st.get(), 3, 9, where, "cell"), {3, 3});
    const int64_t pbc = sqlite3_column_int64(st.get(), 4);
    s.pbc = {(pbc & 1) != 0, (pbc & 2) != 0, (pbc & 4) != 0};
    // The energy column, unless data.energy_key names a key-value pair.
    const bool energy_column = o.energy_key == "energy";
    if (energy_column && sqlite3_column_type(st.get(), 5) != SQLITE_NULL) {
      s.energy = sqlite3_column_double(st.get(), 5) * o.energy_unit;
    }
    if (sqlite3_column_type(st.get(), 6) != SQLITE_NULL) {
      s.forces = doubles(blob<double>(st.get(), 6, n * 3, where, "forces"), {n, 3}) * o.forces_unit;
    }
    if (sqlite3_column_type(st.get(), 7) != SQLITE_NULL) {
      const int bytes = sqlite3_column_bytes(st.get(), 7);
      if (bytes == 6 * 8) {
        const auto v = blob<double>(st.get(), 7, 6, where, "stress");  // xx yy zz yz xz xy
        s.stress = doubles({v[0], v[5], v[4], v[5], v[1], v[3], v[4], v[3], v[2]}, {3, 3}) * o.stress_unit;
      } else {
        s.stress = doubles(blob<double>(st.get(), 7, 9, where, "stress"), {3, 3}) * o.stress_unit;
      }
    }
    if (sqlite3_column_type(st.get(), 8) != SQLITE_NULL) {
      const char* text = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 8));
      nlohmann::json kv;
      try {
        kv = nlohmann::json::parse(text ? text : "{}");
      } catch (const nlohmann::json::exception& e) {
        throw DataError(where + ": key_value_pairs must be JSON, got " + e.what());
      }
      for (const auto& [key, value] : kv.items()) {
        if (key == "config_type" && value.is_string()) {
          s.config_type = value.get<std::string>();
        } else if (!energy_column && key == o.energy_key && value.is_number()) {
          s.energy = value.get<double>() * o.energy_unit;  // energies kept as key-value pairs
        } else {
          s.info[key] = value.is_string() ? value.get<std::string>() : value.dump();
        }
      }
    }
    out.push_back(std::move(s));
  }
  if (rc != SQLITE_DONE) throw DataError(path + ": reading the systems table failed (" + sqlite3_errmsg(db.get()) + ")");
  return out;
}

}  // namespace crucible
