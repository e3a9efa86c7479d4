// DeePMD npy systems. See include/crucible/data/deepmd.h.

#include "crucible/data/deepmd.h"
#include "crucible/data/finite_values.h"

#include "crucible/common/error.h"
#include "crucible/data/npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace crucible {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> words_of(const fs::path& file) {
  std::ifstream f(file);
  if (!f) throw DataError(file.string() + ": must be a readable text file, got a read error");
  std::vector<std::string> words;
  for (std::string w; f >> w;) {
    words.push_back(w);
    if (words.size() > (size_t{1} << 26)) throw DataError(file.string() + ": too many entries");
  }
  return words;
}

/// How many directory levels below a path the search for systems goes.
constexpr int kDeepmdSearchDepth = 16;

std::vector<fs::path> systems_below(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (fs::is_regular_file(root / "type.raw", ec)) return {root};
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && fs::is_regular_file(it->path() / "type.raw", ec)) out.push_back(it->path());
    if (it.depth() + 1 >= kDeepmdSearchDepth) it.disable_recursion_pending();
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// [nframes, k] float64 view of `a` ([nframes, k] or [nframes, ...]).
at::Tensor frames_by(const at::Tensor& a, int64_t nframes, int64_t k, const fs::path& file) {
  if (a.dim() < 1 || a.size(0) != nframes || a.numel() != nframes * k) {
    std::string shape;
    for (int64_t s : a.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(s);
    throw DataError(file.string() + ": must have shape [" + std::to_string(nframes) + ", " + std::to_string(k) +
                    "] (frames of coord.npy, " + std::to_string(k) + " values each), got [" + shape + "]");
  }
  return a.to(at::kDouble).reshape({nframes, k}).contiguous();
}

void read_system(const fs::path& dir, const ExtxyzOptions& o, std::vector<Structure>& out) {
  const std::vector<std::string> type_words = words_of(dir / "type.raw");
  if (!fs::is_regular_file(dir / "type_map.raw")) {
    throw DataError((dir / "type_map.raw").string() + ": a DeePMD system needs type_map.raw (the element of each type), got none");
  }
  const std::vector<std::string> type_map = words_of(dir / "type_map.raw");
  std::vector<int64_t> z;
  for (const auto& w : type_words) {
    int64_t t = -1;
    try {
      t = std::stoll(w);
    } catch (const std::exception&) {
    }
    if (t < 0 || t >= static_cast<int64_t>(type_map.size())) {
      throw DataError((dir / "type.raw").string() + ": types must be integers 0.." + std::to_string(type_map.size() - 1) +
                      " (type_map.raw has " + std::to_string(type_map.size()) + "), got '" + w.substr(0, 20) + "'");
    }
    try {
      z.push_back(atomic_number(type_map[static_cast<size_t>(t)]));
    } catch (const DataError&) {
      throw DataError((dir / "type_map.raw").string() + ": entries must be chemical symbols, got '" +
                      type_map[static_cast<size_t>(t)].substr(0, 20) + "'");
    }
  }
  const auto natoms = static_cast<int64_t>(z.size());
  if (natoms == 0) throw DataError((dir / "type.raw").string() + ": must list the type of every atom, got none");
  const bool periodic = !fs::exists(dir / "nopbc");
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("set.", 0) == 0) sets.push_back(e.path());
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) throw DataError(dir.string() + ": a DeePMD system needs set.* directories with coord.npy, got none");
  const at::Tensor atomic_numbers = at::tensor(z, at::kLong);
  for (const auto& set : sets) {
    const fs::path coord_file = set / "coord.npy";
    if (!fs::is_regular_file(coord_file)) throw DataError(coord_file.string() + ": missing (every set.* needs coord.npy)");
    const at::Tensor coord_raw = read_npy(coord_file.string());
    const int64_t nframes = coord_raw.dim() >= 1 ? coord_raw.size(0) : 0;
    const at::Tensor coord = frames_by(coord_raw, nframes, natoms * 3, coord_file);
    auto optional = [&](const char* name, int64_t k) -> std::optional<at::Tensor> {
      const fs::path file = set / name;
      if (!fs::is_regular_file(file)) return std::nullopt;
      return frames_by(read_npy(file.string()), nframes, k, file);
    };
    const auto box = optional("box.npy", 9);
    if (periodic && !box) throw DataError((set / "box.npy").string() + ": missing (periodic systems need box.npy; non-periodic ones a nopbc file)");
    // data.<label>_key=none leaves that label out on purpose (issue 47).
    const auto energy = o.energy_key == "none" ? std::nullopt : optional("energy.npy", 1);
    const auto force = o.forces_key == "none" ? std::nullopt : optional("force.npy", natoms * 3);
    const auto virial = o.virial_key == "none" ? std::nullopt : optional("virial.npy", 9);
    if (virial && !periodic) {
      throw DataError((set / "virial.npy").string() +
                      ": a virial needs a periodic cell (stress = -virial / volume), and this system is non-periodic "
                      "(nopbc); remove virial.npy or set data.virial_key=none");
    }
    // Issue 47: the frames' memory, bounded before they are made.
    int64_t atoms_read = 0;
    for (const auto& f : out) atoms_read += f.num_atoms();
    check_structures_memory(static_cast<int64_t>(out.size()) + nframes, atoms_read + nframes * natoms,
                            o.memory_budget_bytes, coord_file.string());
    for (int64_t k = 0; k < nframes; ++k) {
      Structure s;
      s.positions = coord[k].view({natoms, 3}).clone();
      s.atomic_numbers = atomic_numbers;  // one tensor for the system's frames (nothing writes to it)
      s.cell = box ? (*box)[k].view({3, 3}).clone() : at::zeros({3, 3}, at::kDouble);
      s.pbc = {periodic, periodic, periodic};
      if (energy) s.energy = (*energy)[k][0].item<double>() * o.energy_unit;
      if (force) s.forces = (*force)[k].view({natoms, 3}) * o.forces_unit;
      if (virial) {
        const double volume = s.volume();
        if (!(volume > 0)) {
          throw DataError(fmt::format("{}/{} frame {}: box.npy has volume 0, so the virial has no stress "
                                      "(stress = -virial / volume); fix the box or set data.virial_key=none",
                                      dir.string(), set.filename().string(), k));
        }
        s.stress = (*virial)[k].view({3, 3}) * (-o.energy_unit / volume);
      }
      s.source = fmt::format("{}/{} frame {}", dir.string(), set.filename().string(), k);
      check_finite_values(s);  // binary doubles: NaN / inf are refused here, naming the frame
      out.push_back(std::move(s));
    }
  }
}

}  // namespace

bool is_deepmd_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  return !systems_below(path).empty();
}

std::vector<Structure> read_deepmd(const std::string& path, const ExtxyzOptions& options) {
  if (!fs::is_directory(path)) throw DataError(path + ": a DeePMD system must be a directory with type.raw");
  const std::vector<fs::path> systems = systems_below(path);
  if (systems.empty()) {
    throw DataError(path + ": directory holds no DeePMD system (type.raw in it or up to " +
                    std::to_string(kDeepmdSearchDepth) + " levels below)");
  }
  std::vector<Structure> out;
  for (const auto& dir : systems) read_system(dir, options, out);
  return out;
}

void write_deepmd(const std::string& dir, const std::vector<Structure>& structures) {
  if (fs::exists(dir) && !(fs::is_directory(dir) && fs::is_empty(dir))) {
    throw DataError(dir + ": the DeePMD output must be a new or empty directory (nothing is overwritten)");
  }
  // Systems keyed by (atoms, periodic, labels), in order of first appearance.
  struct System {
    std::vector<const Structure*> frames;
  };
  std::vector<std::pair<std::string, System>> systems;
  for (const auto& s : structures) {
    const bool all = s.pbc[0] && s.pbc[1] && s.pbc[2];
    if (s.periodic() && !all) {
      throw DataError(s.source + ": DeePMD systems are periodic in all directions or none, got pbc " +
                      fmt::format("{} {} {}", s.pbc[0], s.pbc[1], s.pbc[2]));
    }
    if (s.stress && !(all && s.has_volume())) {  // convert never writes fewer labels than it read
      throw DataError(s.source + ": DeePMD keeps stress as virial.npy, which needs a periodic box of non-zero volume, "
                      "and this frame has none; write extxyz or an ASE database instead");
    }
    std::ostringstream key;
    const at::Tensor z = s.atomic_numbers.contiguous();
    for (int64_t a = 0; a < z.numel(); ++a) key << z.data_ptr<int64_t>()[a] << ' ';
    key << '|' << all << s.energy.has_value() << s.forces.has_value() << s.stress.has_value();
    auto it = std::find_if(systems.begin(), systems.end(), [&](const auto& p) { return p.first == key.str(); });
    if (it == systems.end()) {
      systems.push_back({key.str(), {}});
      it = systems.end() - 1;
    }
    it->second.frames.push_back(&s);
  }
  fs::create_directories(dir);
  for (size_t k = 0; k < systems.size(); ++k) {
    const auto& frames = systems[k].second.frames;
    const Structure& first = *frames.front();
    const fs::path sys = fs::path(dir) / fmt::format("system_{:03d}", k);
    fs::create_directories(sys / "set.000");
    const at::Tensor z = first.atomic_numbers.contiguous();
    std::vector<int64_t> elements(z.data_ptr<int64_t>(), z.data_ptr<int64_t>() + z.numel());
    std::sort(elements.begin(), elements.end());
    elements.erase(std::unique(elements.begin(), elements.end()), elements.end());
    {
      std::ofstream tm(sys / "type_map.raw"), ty(sys / "type.raw");
      for (int64_t e : elements) tm << chemical_symbol(e) << "\n";
      for (int64_t a = 0; a < z.numel(); ++a) {
        ty << (std::lower_bound(elements.begin(), elements.end(), z.data_ptr<int64_t>()[a]) - elements.begin()) << "\n";
      }
      if (!tm.flush() || !ty.flush()) throw DataError(sys.string() + ": cannot write type.raw / type_map.raw");
    }
    const bool periodic = first.pbc[0];
    if (!periodic) std::ofstream(sys / "nopbc") << "";
    const auto n = static_cast<int64_t>(frames.size());
    std::vector<at::Tensor> coord, box, energy, force, virial;
    for (const Structure* s : frames) {
      coord.push_back(s->positions.to(at::kDouble).reshape({-1}));
      if (periodic) box.push_back(s->cell.to(at::kDouble).reshape({-1}));
      if (s->energy) energy.push_back(at::tensor({*s->energy}, at::kDouble));
      if (s->forces) force.push_back(s->forces->to(at::kDouble).reshape({-1}));
      if (s->stress) virial.push_back((*s->stress * -s->volume()).to(at::kDouble).reshape({-1}));
    }
    const fs::path set = sys / "set.000";
    write_npy((set / "coord.npy").string(), at::stack(coord));
    if (periodic) write_npy((set / "box.npy").string(), at::stack(box));
    if (!energy.empty()) write_npy((set / "energy.npy").string(), at::cat(energy).view({n}));
    if (!force.empty()) write_npy((set / "force.npy").string(), at::stack(force));
    if (!virial.empty()) write_npy((set / "virial.npy").string(), at::stack(virial));
  }
}

}  // namespace crucible
