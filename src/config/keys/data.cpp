// Recipe keys, data.*: the files, label keys, units and E0s (read by src/run/training_setup.cpp, src/data/).

#include "../schema.h"

#include "crucible/models/registry.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_data_keys(KeyTable& t) {
  // data
  t.add("data.train_file", Kind::kString, "",
      "Extended XYZ file with the training structures (and the validation structures when "
      "data.valid_file is null). A relative path is looked up in the current directory, then "
      "in the data/ folder of the Crucible source tree.",
      [](Config& c) -> void* { return &c.data.train_file; });
  t.add("data.valid_file", Kind::kOptString, "",
      "Extended XYZ file with the validation structures. null = hold out "
      "data.valid_fraction of data.train_file instead.",
      [](Config& c) -> void* { return &c.data.valid_file; });
  {
    Key& key = t.add("data.valid_fraction", Kind::kFloat, "",
                   "Fraction of data.train_file held out for validation when data.valid_file "
                   "is null (rounded, at least one structure). In (0, 1).",
                   [](Config& c) -> void* { return &c.data.valid_fraction; });
    min_excl(key, 0.0);
    key.max = 1.0;
  }
  min_incl(t.add("data.seed", Kind::kInt, "",
               "Seed of the random train/validation split (independent of training.seed).",
               [](Config& c) -> void* { return &c.data.seed; }),
           0.0);
  t.add("data.energy_key", Kind::kString, "",
      "Header (info) key of the total energy in the extxyz comment line (MACE: energy_key); "
      "none leaves energies out on purpose. A file holding an energy under another name "
      "(REF_energy, dft_energy, free_energy, ...) is refused naming the key to set.",
      [](Config& c) -> void* { return &c.data.energy_key; });
  t.add("data.forces_key", Kind::kString, "",
      "Properties column with the forces. \"\" = \"forces\", or \"force\" if the file has no "
      "\"forces\" column (MACE: forces_key); none leaves forces out on purpose. Forces under "
      "another name (REF_forces, dft_force, ...) are refused naming the key to set.",
      [](Config& c) -> void* { return &c.data.forces_key; });
  t.add("data.stress_key", Kind::kString, "",
      "Header key of the stress: 9 values (row-major 3x3) or 6 Voigt values (xx yy zz yz xz "
      "xy), ASE sign convention (positive = tensile); none leaves stresses out on purpose. A "
      "stress under another name (REF_stress, dft_stress, ...) is refused naming the key to set.",
      [](Config& c) -> void* { return &c.data.stress_key; });
  t.add("data.virial_key", Kind::kString, "",
      "Header key of the virial (9 or 6 values, energy unit); used as stress = -virial / "
      "volume when a frame has no stress; none leaves virials out on purpose. A virial under "
      "another name (REF_virials, dft_virial, ...) is refused naming the key to set.",
      [](Config& c) -> void* { return &c.data.virial_key; });
  {
    Key& key = t.add("data.energy_unit", Kind::kUnit, "",
                   "Unit of the energies (and virials) in the files: a name (eV, meV, "
                   "kcal/mol, kJ/mol, Hartree, Ry) or a number, the multiplier to eV.",
                   [](Config& c) -> void* { return &c.data.energy_unit; });
    key.unit_quantity = UnitQuantity::kEnergy;
  }
  {
    Key& key = t.add("data.forces_unit", Kind::kUnit, "",
                   "Unit of the forces in the files: a name (eV/Å or eV/A, kcal/mol/Å, "
                   "kJ/mol/Å, Hartree/Bohr, ...) or a number, the multiplier to eV/Å.",
                   [](Config& c) -> void* { return &c.data.forces_unit; });
    key.unit_quantity = UnitQuantity::kForces;
  }
  {
    Key& key = t.add("data.stress_unit", Kind::kUnit, "",
                   "Unit of the stresses in the files: a name (eV/Å^3, GPa, kbar, "
                   "Hartree/Bohr^3, ...) or a number, the multiplier to eV/Å^3.",
                   [](Config& c) -> void* { return &c.data.stress_unit; });
    key.unit_quantity = UnitQuantity::kStress;
  }

  t.add("data.format", Kind::kString, "",
      "Format of data.train_file / data.valid_file (and of evaluate's --data): auto (a directory "
      "holding a DeePMD system, type.raw, in it or below is deepmd; a .db file ase_db; anything "
      "else extxyz), "
      "extxyz, or deepmd (DeePMD-kit npy systems: type.raw, type_map.raw, set.*/coord.npy, "
      "box.npy, energy.npy, force.npy, virial.npy), or ase_db (an ASE SQLite database, .db: "
      "numbers, positions, cell, pbc, energy, forces, stress, key-value pairs; auto picks it for "
      ".db files). Units apply to every format.",
      [](Config& c) -> void* { return &c.data.format; })
      .choices = {"auto", "extxyz", "deepmd", "ase_db"};
  t.add("data.e0s", Kind::kE0s, "eV",
      "Per-element reference energies E0, subtracted before the model learns the rest (MACE: "
      "E0s). least_squares (MACE's average): fit on the training energies (a warning names elements that every "
      "structure has in the same proportions, whose split is then NumPy's minimum-norm "
      "solution); isolated: the energies of the training file's isolated-atom frames "
      "(config_type=IsolatedAtom, or one atom without periodicity), which are then removed from "
      "training and validation; zero; with model.init_from, foundation (the source model's E0s) or "
      "estimated (the source's E0s plus a least-squares fit of its energy errors on the training "
      "data, MACE's estimated); a map of element to eV, e.g. {Ti: -2.1, Al: -3.4}; or a "
      "JSON file (*.json) holding such a map (keys: symbols or atomic numbers). An element of "
      "the training data without an E0 is an error.",
      [](Config& c) -> void* { return &c.data.e0s; });
}

}  // namespace crucible::config_schema
