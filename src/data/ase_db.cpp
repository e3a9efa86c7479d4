// ASE SQLite databases. See include/crucible/data/ase_db.h.

#include "crucible/data/ase_db.h"

#include <fcntl.h>
#include <unistd.h>

#include "crucible/common/error.h"
#include "crucible/data/finite_values.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>
#include <fstream>
#include <cmath>
#include <map>
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
      const int type = sqlite3_column_type(st.get(), 5);
      if (type != SQLITE_FLOAT && type != SQLITE_INTEGER) {  // SQLite would read 'abc' as 0.0
        const char* text = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 5));
        throw DataError(fmt::format("{}: energy must be a number, got {} '{}'", where,
                                    type == SQLITE_TEXT ? "text" : "a blob", text && type == SQLITE_TEXT ? text : ""));
      }
      s.energy = sqlite3_column_double(st.get(), 5) * o.energy_unit;
    }
    // The stored label columns, for the label audit (issue 47): an energy
    // column that data.energy_key does not name is found, not dropped.
    if (sqlite3_column_type(st.get(), 5) != SQLITE_NULL) s.columns.push_back("energy");
    if (sqlite3_column_type(st.get(), 6) != SQLITE_NULL) s.columns.push_back("forces");
    if (sqlite3_column_type(st.get(), 7) != SQLITE_NULL) s.columns.push_back("stress");
    if (sqlite3_column_type(st.get(), 6) != SQLITE_NULL && o.forces_key != "none") {
      s.forces = doubles(blob<double>(st.get(), 6, n * 3, where, "forces"), {n, 3}) * o.forces_unit;
    }
    if (sqlite3_column_type(st.get(), 7) != SQLITE_NULL && o.stress_key != "none") {
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
        } else if (!energy_column && key == o.energy_key) {
          if (!value.is_number()) {
            throw DataError(fmt::format("{}: key-value pair {} (data.energy_key) must be a number, got {}", where,
                                        key, value.dump()));
          }
          s.energy = value.get<double>() * o.energy_unit;  // energies kept as key-value pairs
        } else {
          s.info[key] = value.is_string() ? value.get<std::string>() : value.dump();
        }
      }
    }
    check_finite_values(s);  // NaN / inf in the blobs are refused, naming the row
    out.push_back(std::move(s));
  }
  if (rc != SQLITE_DONE) throw DataError(path + ": reading the systems table failed (" + sqlite3_errmsg(db.get()) + ")");
  return out;
}

namespace {

// The tables and indices of ASE 3.22's ase/db/sqlite.py (schema version 9),
// in the column order ASE reads by position.
constexpr const char* kSchema = R"(
CREATE TABLE systems (
  id INTEGER PRIMARY KEY AUTOINCREMENT, unique_id TEXT UNIQUE, ctime REAL, mtime REAL, username TEXT,
  numbers BLOB, positions BLOB, cell BLOB, pbc INTEGER, initial_magmoms BLOB, initial_charges BLOB,
  masses BLOB, tags BLOB, momenta BLOB, constraints TEXT, calculator TEXT, calculator_parameters TEXT,
  energy REAL, free_energy REAL, forces BLOB, stress BLOB, dipole BLOB, magmoms BLOB, magmom REAL,
  charges BLOB, key_value_pairs TEXT, data BLOB, natoms INTEGER, fmax REAL, smax REAL, volume REAL,
  mass REAL, charge REAL);
CREATE TABLE species (Z INTEGER, n INTEGER, id INTEGER, FOREIGN KEY (id) REFERENCES systems(id));
CREATE TABLE keys (key TEXT, id INTEGER, FOREIGN KEY (id) REFERENCES systems(id));
CREATE TABLE text_key_values (key TEXT, value TEXT, id INTEGER, FOREIGN KEY (id) REFERENCES systems(id));
CREATE TABLE number_key_values (key TEXT, value REAL, id INTEGER, FOREIGN KEY (id) REFERENCES systems(id));
CREATE TABLE information (name TEXT, value TEXT);
CREATE INDEX unique_id_index ON systems(unique_id);
CREATE INDEX ctime_index ON systems(ctime);
CREATE INDEX username_index ON systems(username);
CREATE INDEX calculator_index ON systems(calculator);
CREATE INDEX species_index ON species(Z);
CREATE INDEX key_index ON keys(key);
CREATE INDEX text_index ON text_key_values(key);
CREATE INDEX number_index ON number_key_values(key);
INSERT INTO information VALUES ('version', '9');
)";

void exec(sqlite3* db, const std::string& sql, const std::string& path) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
    const std::string m = msg ? msg : "unknown error";
    sqlite3_free(msg);
    throw DataError(path + ": cannot write the ASE database (" + m + ")");
  }
}

std::unique_ptr<sqlite3_stmt, Closer> prepare(sqlite3* db, const char* sql, const std::string& path) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
    throw DataError(path + ": cannot write the ASE database (" + sqlite3_errmsg(db) + ")");
  }
  return std::unique_ptr<sqlite3_stmt, Closer>(st);
}

void step(sqlite3* db, sqlite3_stmt* st, const std::string& path) {
  if (sqlite3_step(st) != SQLITE_DONE) throw DataError(path + ": cannot write the ASE database (" + sqlite3_errmsg(db) + ")");
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
}

void bind_doubles(sqlite3_stmt* st, int col, const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  sqlite3_bind_blob(st, col, c.data_ptr<double>(), static_cast<int>(c.numel() * 8), SQLITE_TRANSIENT);
}

}  // namespace

void write_ase_db(const std::string& path, const std::vector<Structure>& structures) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) throw DataError(path + ": the ASE database to write must be a new file (nothing is overwritten)");
  // Written under a name of this process's own, renamed at the end (an
  // existing <path>.tmp is someone else's and is left alone).
  const std::string tmp = path + ".crucible-" + std::to_string(::getpid()) + ".tmp";
  if (fs::exists(tmp)) throw DataError(tmp + ": exists; remove it or choose another output name");
  try {
  {
    // Created here first, so a refusal names the system's reason (EPERM,
    // ENOSPC, ...); SQLite takes an empty file as a new database.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw DataError(tmp + ": cannot create the ASE database (" + std::strerror(errno) + ")");
    ::close(fd);
    sqlite3* raw = nullptr;
    if (sqlite3_open_v2(tmp.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
      const std::string why = raw ? sqlite3_errmsg(raw) : "out of memory";
      sqlite3_close(raw);
      throw DataError(path + ": cannot create the ASE database (" + why + ")");
    }
    std::unique_ptr<sqlite3, Closer> db(raw);
    exec(db.get(), kSchema, path);
    exec(db.get(), "BEGIN", path);
    auto sys = prepare(db.get(),
                       "INSERT INTO systems (unique_id, ctime, mtime, username, numbers, positions, cell, pbc, energy, "
                       "forces, stress, key_value_pairs, data, natoms, fmax, smax, volume, charge) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'null', ?, ?, ?, ?, 0.0)",
                       path);
    auto species = prepare(db.get(), "INSERT INTO species VALUES (?, ?, ?)", path);
    auto keys = prepare(db.get(), "INSERT INTO keys VALUES (?, ?)", path);
    auto text_kv = prepare(db.get(), "INSERT INTO text_key_values VALUES (?, ?, ?)", path);
    auto number_kv = prepare(db.get(), "INSERT INTO number_key_values VALUES (?, ?, ?)", path);
    std::mt19937_64 rng(std::random_device{}());
    const double now = (std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                        946681200.0) / 31557600.0;  // ASE's ctime: years since 2000
    const char* user = std::getenv("USER");
    static const std::regex identifier("[A-Za-z_][A-Za-z0-9_]*");
    for (const auto& s : structures) {
      const int64_t n = s.num_atoms();
      sqlite3_stmt* st = sys.get();
      sqlite3_bind_text(st, 1, fmt::format("{:016x}{:016x}", rng(), rng()).c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_double(st, 2, now);
      sqlite3_bind_double(st, 3, now);
      if (user) sqlite3_bind_text(st, 4, user, -1, SQLITE_TRANSIENT);
      const at::Tensor z = s.atomic_numbers.to(at::kInt).contiguous();
      sqlite3_bind_blob(st, 5, z.data_ptr<int32_t>(), static_cast<int>(n * 4), SQLITE_TRANSIENT);
      bind_doubles(st, 6, s.positions);
      bind_doubles(st, 7, s.cell.defined() ? s.cell : at::zeros({3, 3}, at::kDouble));
      sqlite3_bind_int(st, 8, (s.pbc[0] ? 1 : 0) + (s.pbc[1] ? 2 : 0) + (s.pbc[2] ? 4 : 0));
      if (s.energy) sqlite3_bind_double(st, 9, *s.energy);
      if (s.forces) bind_doubles(st, 10, *s.forces);
      if (s.stress) {
        const at::Tensor m = s.stress->to(at::kDouble);
        bind_doubles(st, 11, at::stack({m[0][0], m[1][1], m[2][2], m[1][2], m[0][2], m[0][1]}));
      }
      nlohmann::json kv = nlohmann::json::object();
      if (s.config_type != "Default") kv["config_type"] = s.config_type;
      for (const auto& [key, value] : s.info) {
        if (!std::regex_match(key, identifier) || kv.contains(key)) continue;
        char* end = nullptr;
        const double number = std::strtod(value.c_str(), &end);
        if (!value.empty() && end && *end == '\0' && std::isfinite(number)) {
          kv[key] = value.find_first_of(".eE") == std::string::npos && std::abs(number) < 9e15
                        ? nlohmann::json(static_cast<int64_t>(number))
                        : nlohmann::json(number);
        } else {
          kv[key] = value;
        }
      }
      sqlite3_bind_text(st, 12, kv.dump().c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(st, 13, n);
      if (s.forces) sqlite3_bind_double(st, 14, s.forces->to(at::kDouble).norm(2, 1).max().item<double>());
      if (s.stress) sqlite3_bind_double(st, 15, s.stress->to(at::kDouble).abs().max().item<double>());
      if (s.periodic()) sqlite3_bind_double(st, 16, s.volume());
      step(db.get(), st, path);
      const int64_t id = sqlite3_last_insert_rowid(db.get());
      std::map<int64_t, int64_t> counts;
      for (int64_t a = 0; a < n; ++a) ++counts[z.data_ptr<int32_t>()[a]];
      for (const auto& [zz, count] : counts) {
        sqlite3_bind_int64(species.get(), 1, zz);
        sqlite3_bind_int64(species.get(), 2, count);
        sqlite3_bind_int64(species.get(), 3, id);
        step(db.get(), species.get(), path);
      }
      for (const auto& [key, value] : kv.items()) {
        sqlite3_bind_text(keys.get(), 1, key.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(keys.get(), 2, id);
        step(db.get(), keys.get(), path);
        sqlite3_stmt* t = value.is_string() ? text_kv.get() : number_kv.get();
        sqlite3_bind_text(t, 1, key.c_str(), -1, SQLITE_TRANSIENT);
        if (value.is_string()) {
          sqlite3_bind_text(t, 2, value.get<std::string>().c_str(), -1, SQLITE_TRANSIENT);
        } else {
          sqlite3_bind_double(t, 2, value.get<double>());
        }
        sqlite3_bind_int64(t, 3, id);
        step(db.get(), t, path);
      }
    }
    exec(db.get(), "COMMIT", path);
  }
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw DataError(path + ": cannot write the ASE database (" + ec.message() + ")");
  }
}

}  // namespace crucible
