// See include/crucible/report/error_report.h.

#include "crucible/report/error_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace crucible {

namespace {

bool worse(double model, double baseline) { return std::isfinite(model) && baseline > 0 && model >= baseline; }

}  // namespace

std::string format_metric(double value, int64_t count, const char* unit, int precision) {
  if (count == 0 || !std::isfinite(value)) return "n/a";
  return fmt::format("{:.{}f} {}", value, precision, unit);
}

void write_error_report(std::ostream& out, const ValidationSummary& v, const std::string& indent) {
  out << fmt::format("{}energy  MAE {:>16}   RMSE {:>16}   ({} structures)\n", indent,
                     format_metric(v.energy_mae, v.num_energies, "meV/atom"),
                     format_metric(v.energy_rmse, v.num_energies, "meV/atom"), v.num_energies);
  out << fmt::format("{}forces  MAE {:>16}   RMSE {:>16}   ({} components)\n", indent,
                     format_metric(v.forces_mae, v.num_forces, "meV/Å"),
                     format_metric(v.forces_rmse, v.num_forces, "meV/Å"), v.num_forces);
  if (v.num_stresses > 0) {
    out << fmt::format("{}stress  MAE {:>16}   RMSE {:>16}   ({} components)\n", indent,
                       format_metric(v.stress_mae, v.num_stresses, "meV/Å³", 3),
                       format_metric(v.stress_rmse, v.num_stresses, "meV/Å³", 3), v.num_stresses);
  }
  if (v.num_forces > 0) {
    const double ratio = v.forces_mae / v.zero_forces_mae;
    out << fmt::format("{}zero-forces baseline MAE {:.2f} meV/Å; model/baseline = {:.3f}{}\n", indent,
                       v.zero_forces_mae, ratio,
                       worse(v.forces_mae, v.zero_forces_mae)
                           ? " (WORSE than predicting zero forces: the forces are not learned)"
                           : "");
  }
  if (v.num_energies > 1) {
    const double ratio = v.energy_rmse / v.mean_energy_rmse;
    out << fmt::format("{}mean-energy baseline RMSE {:.2f} meV/atom (spread of the labels); model/baseline = {:.3f}{}\n",
                       indent, v.mean_energy_rmse, ratio,
                       worse(v.energy_rmse, v.mean_energy_rmse)
                           ? " (WORSE than predicting the mean energy per atom: the energies are not learned)"
                           : "");
  }
  if (v.per_config_type.size() > 1) {
    out << fmt::format("{}{:<20} {:>10}  {:>16} {:>16}  {:>14} {:>14}  {}\n", indent, "config_type", "structures",
                       "E MAE", "E RMSE", "F MAE", "F RMSE", "flags");
    bool flagged = false;
    for (const auto& [type, m] : v.per_config_type) {
      std::string flags;
      if (m.num_energies > 1 && worse(m.energy_rmse, m.mean_energy_rmse)) flags += "E! ";
      if (m.num_forces > 0 && worse(m.forces_mae, m.zero_forces_mae)) flags += "F! ";
      flagged = flagged || !flags.empty();
      out << fmt::format("{}{:<20} {:>10}  {:>16} {:>16}  {:>14} {:>14}  {}\n", indent, type, m.num_structures,
                         format_metric(m.energy_mae, m.num_energies, "meV/atom"),
                         format_metric(m.energy_rmse, m.num_energies, "meV/atom"),
                         format_metric(m.forces_mae, m.num_forces, "meV/Å"),
                         format_metric(m.forces_rmse, m.num_forces, "meV/Å"), flags);
    }
    if (flagged) {
      out << indent
          << "E!: energy RMSE at or above that type's mean-energy baseline; F!: force MAE at or above its "
             "zero-forces baseline\n";
    }
  }
}

namespace {

void read_metrics(const nlohmann::json& j, ErrorMetrics& m) {
  auto number = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
  };
  auto count = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
  };
  m.energy_mae = number("energy_mae");
  m.energy_rmse = number("energy_rmse");
  m.forces_mae = number("forces_mae");
  m.forces_rmse = number("forces_rmse");
  m.stress_mae = number("stress_mae");
  m.stress_rmse = number("stress_rmse");
  m.zero_forces_mae = number("zero_forces_mae");
  m.mean_energy_rmse = number("mean_energy_rmse");
  m.num_energies = count("num_energies");
  m.num_forces = count("num_forces");
  m.num_stresses = count("num_stresses");
  m.num_structures = count("num_structures");
}

}  // namespace

ValidationSummary validation_from_json(const nlohmann::json& j) {
  ValidationSummary v;
  if (!j.is_object()) return v;
  read_metrics(j, v);
  const auto types = j.find("per_config_type");
  if (types != j.end() && types->is_object()) {
    for (const auto& [name, m] : types->items()) read_metrics(m, v.per_config_type[name]);
  }
  return v;
}

}  // namespace crucible
