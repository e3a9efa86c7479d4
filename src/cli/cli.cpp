// `crucible` command line (CLI11): train, evaluate, config. The one place where
// exceptions become exit codes: user errors → 1, internal errors → 2.

#include "crucible/cli/cli.h"

#include "crucible/cli/commands.h"
#include "crucible/run/data_paths.h"
#include "crucible/run/mace_files.h"
#include "crucible/run/training_run.h"
#include "crucible/common/error.h"
#include "crucible/common/fs_error.h"
#include "crucible/config/config.h"
#include "crucible/distributed/launcher.h"
#include "crucible/distributed/process_group.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace crucible {

namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "crucible: error: ";

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-.,/:=+@%") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

Config resolve_config(const std::string& config_file, const std::vector<std::string>& overrides) {
  Config config = load_run_config(config_file, overrides);  // with model.type's recipe
  validate_config(config);
  return config;
}

int run(int argc, char** argv) {
  CLI::App app{
      "Crucible: train and evaluate machine-learned interatomic potentials (SchNet, MACE) on "
      "extended XYZ data.\n\nExamples:\n"
      "  crucible train                                  # bundled TiAl data, defaults\n"
      "  crucible train --config configs/ethanol.yaml training.num_epochs=5\n"
      "  crucible evaluate --model runs/ethanol --data test.xyz\n"
      "  crucible config --dump-default > my.yaml",
      "crucible"};
  app.set_version_flag("--version", "crucible 0.1.0");
  app.require_subcommand(1);
  app.get_formatter()->column_width(34);

  // train
  std::string train_config;
  std::vector<std::string> train_overrides;
  bool print_config = false;
  std::string run_dir_flag;
  bool overwrite_flag = false;
  CLI::App* train = app.add_subcommand(
      "train",
      "Train a model. Reads the data and config, checks them, then writes the run directory "
      "(config.yaml, metrics.csv, model.pt, model.json, summary.json last).");
  train->add_option("-c,--config", train_config, "YAML config file (see `crucible config "
                                                 "--dump-default`; configs/NAME.yaml is also looked "
                                                 "for in the source tree); default: built-in defaults");
  train->add_option("overrides", train_overrides,
                    "Config overrides key.path=value, e.g. training.num_epochs=3 model.cutoff=4.5 "
                    "data.train_file=foo.xyz (values parsed as YAML)");
  train->add_option("-o,--run-dir", run_dir_flag, "Same as output.run_dir=DIR");
  train->add_flag("--overwrite", overwrite_flag, "Same as output.overwrite=true");
  std::string resume_dir;
  int64_t resume_checkpoint = -1;
  train->add_option("--resume", resume_dir,
                    "Continue the unfinished run in this directory from its newest intact "
                    "checkpoint (its config.yaml, plus any overrides given)");
  train->add_option("--checkpoint", resume_checkpoint,
                    "With --resume: the checkpoint index to continue from");
  int nproc = 1;
  train->add_option("--nproc", nproc,
                    "Data-parallel training with N local worker processes (Gloo; torchrun-style "
                    "variables for several machines: see the README)")
      ->check(CLI::Range(1, 1024));
  train->add_flag("--print-config", print_config,
                  "Print the resolved config (defaults + file + overrides) as YAML and exit");

  // evaluate
  EvaluateRequest eval;
  std::string e_energy_key, e_forces_key, e_stress_key, e_virial_key, e_energy_unit, e_forces_unit,
      e_stress_unit, e_json;
  CLI::App* evaluate = app.add_subcommand(
      "evaluate",
      "Evaluate a trained model on an extxyz file: energy (meV/atom), forces (meV/Å) and stress "
      "(meV/Å³) MAE/RMSE and the zero-forces baseline. Data keys and units default to those "
      "used in training.");
  evaluate->add_option("-m,--model", eval.model_dir, "Run directory with model.json and model.pt")
      ->required();
  evaluate->add_option("-d,--data", eval.data_file, "Extended XYZ file to evaluate on")->required();
  evaluate->add_option("overrides", eval.overrides,
                       "data.* overrides, e.g. data.energy_unit=kcal/mol data.forces_key=F");
  evaluate->add_option("--energy-key", e_energy_key, "Same as data.energy_key=KEY");
  evaluate->add_option("--forces-key", e_forces_key, "Same as data.forces_key=KEY");
  evaluate->add_option("--stress-key", e_stress_key, "Same as data.stress_key=KEY");
  evaluate->add_option("--virial-key", e_virial_key, "Same as data.virial_key=KEY");
  evaluate->add_option("--energy-unit", e_energy_unit, "Same as data.energy_unit=UNIT");
  evaluate->add_option("--forces-unit", e_forces_unit, "Same as data.forces_unit=UNIT");
  evaluate->add_option("--stress-unit", e_stress_unit, "Same as data.stress_unit=UNIT");
  evaluate->add_option("--batch-size", eval.batch_size, "Structures per batch (default 32)");
  evaluate->add_option("--device", eval.device, "cpu, cuda or cuda:N (default cpu)");
  evaluate->add_flag("--exact", eval.exact,
                     "Evaluate MACE's radial MLP and SchNet's filter network per pair instead of their splines "
                     "(the reference path; the splines' error, printed by crucible info, is below 1e-7 relative "
                     "in energies)");
  evaluate->add_option("--json", e_json, "Also write the metrics to this JSON file");
  std::string e_write, e_parity;
  evaluate->add_option("--parity", e_parity, "Also draw energy and force parity plots to this SVG file");
  evaluate->add_option("--write", e_write,
                       "Also write every structure with the predictions to this extxyz file "
                       "(crucible_energy, crucible_stress, crucible_forces, crucible_energies; eV units)");

  // info
  std::string info_path;
  CLI::App* info = app.add_subcommand(
      "info", "Print a trained model's type, hyperparameters, parameter count, elements, E0s, cutoff, "
              "precision and the recipe it was trained with.");
  info->add_option("path", info_path, "Run directory, or model.pt with model.json beside it")->required();

  // convert
  ConvertRequest convert;
  CLI::App* convert_cmd = app.add_subcommand(
      "convert", "Convert structures between extended XYZ, DeePMD npy systems and ASE databases");
  convert_cmd->add_option("input", convert.input, "extxyz file, DeePMD system directory or ASE .db")->required();
  convert_cmd->add_option("output", convert.output, ".xyz/.extxyz file, .db file, or a new directory for DeePMD")->required();
  convert_cmd->add_option("--from", convert.from, "Input format: auto, extxyz, deepmd, ase_db")
      ->check(CLI::IsMember({"auto", "extxyz", "deepmd", "ase_db"}));
  convert_cmd->add_option("--to", convert.to, "Output format: auto (by extension), extxyz, deepmd, ase_db")
      ->check(CLI::IsMember({"auto", "extxyz", "deepmd", "ase_db"}));
  convert_cmd->add_option("overrides", convert.overrides, "data.* keys and units of the input, e.g. data.energy_key=dft_energy");
  convert_cmd->add_flag("--overwrite", convert.overwrite, "Replace an existing OUTPUT (never the input itself)");

  // export kim
  ExportKimRequest export_kim;
  CLI::App* export_cmd = app.add_subcommand("export", "Export a trained model for a simulator.");
  export_cmd->require_subcommand(1);
  CLI::App* export_kim_cmd = export_cmd->add_subcommand(
      "kim", "Write a KIM portable model (with its model driver) for LAMMPS: "
             "kim-api-collections-management install user DIR installs it");
  export_kim_cmd->add_option("run_dir", export_kim.run_dir, "Run directory, or model.pt with model.json beside it")
      ->required();
  export_kim_cmd->add_option("--name", export_kim.name, "KIM model name (letters, digits, _)")->required();
  export_kim_cmd->add_option("--out", export_kim.out_dir, "New or empty directory to write")->required();
  export_kim_cmd->add_option("--dtype", export_kim.dtype, "Evaluation dtype of the KIM model: float64 (default) or float32")
      ->check(CLI::IsMember({"float64", "float32"}));

  // import mace
  ImportMaceRequest import_mace_req;
  CLI::App* import_cmd = app.add_subcommand("import", "Import a model trained elsewhere into a Crucible run directory.");
  import_cmd->require_subcommand(1);
  CLI::App* import_mace_cmd = import_cmd->add_subcommand(
      "mace", "A MACE v0.3 model: its _compiled.model (TorchScript), or a .pt state_dict with --hyperparameters");
  import_mace_cmd->add_option("file", import_mace_req.file, "MACE _compiled.model, or .pt state_dict / checkpoint")
      ->required();
  import_mace_cmd->add_option("--hyperparameters", import_mace_req.hyperparameters,
                              "JSON of MACE's hyper-parameters (for a .pt; python3 -m crucible.mace_to_pt writes it)");
  import_mace_cmd->add_option("--out", import_mace_req.out_dir, "New or empty run directory to write")->required();

  ExportMaceRequest export_mace;
  CLI::App* export_mace_cmd = export_cmd->add_subcommand(
      "mace", "Write a model imported from MACE (fine-tuned or not) back as MACE's state_dict FILE.pt and FILE.json");
  export_mace_cmd->add_option("run_dir", export_mace.run_dir, "Run directory, or model.pt with model.json beside it")
      ->required();
  export_mace_cmd->add_option("--out", export_mace.out_file, "FILE.pt to write (FILE.json beside it)")->required();

  // config
  bool dump_default = false, markdown = false;
  std::string cfg_file;
  std::vector<std::string> cfg_overrides;
  CLI::App* config_cmd = app.add_subcommand(
      "config", "Print a configuration: the defaults, or a file with overrides applied.");
  config_cmd->add_flag("--dump-default", dump_default,
                       "Print the default config, every key commented (as configs/default.yaml)");
  config_cmd->add_flag("--markdown", markdown, "Print the table of keys as Markdown");
  config_cmd->add_option("-c,--config", cfg_file, "YAML config file to resolve");

  // spec
  std::string spec_config, spec_file;
  std::vector<std::string> spec_overrides;
  CLI::App* spec_cmd = app.add_subcommand(
      "spec", "The training recipe as a JSON spec (every config key, typed): dump or validate.");
  spec_cmd->require_subcommand(1);
  CLI::App* spec_dump = spec_cmd->add_subcommand(
      "dump", "Print the recipe of a config file (or the defaults) with overrides as JSON");
  spec_dump->add_option("-c,--config", spec_config, "YAML config file");
  spec_dump->add_option("overrides", spec_overrides, "Config overrides key.path=value");
  CLI::App* spec_validate = spec_cmd->add_subcommand(
      "validate", "Check a JSON spec: unknown keys and wrong types are errors naming the key");
  spec_validate->add_option("file", spec_file, "JSON spec file")->required();
  config_cmd->add_option("overrides", cfg_overrides, "Config overrides key.path=value");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << kPrefix << e.what() << "\n";
    std::cerr << "Run with --help for more information.\n";
    return 1;
  }

  if (train->parsed()) {
    ResumeOptions resume;
    if (!resume_dir.empty()) {
      if (!train_config.empty() || !run_dir_flag.empty() || overwrite_flag) {
        throw ConfigError("--resume takes the run's own config.yaml and directory; --config, "
                          "--run-dir and --overwrite must not be given with it");
      }
      resume.resume = true;
      train_config = resume_dir + "/config.yaml";
      run_dir_flag = resume_dir;
    }
    if (resume_checkpoint >= 0) {
      if (!resume.resume) throw ConfigError("--checkpoint needs --resume RUN_DIR");
      resume.checkpoint = resume_checkpoint;
    }
    if (!resume.resume && !train_config.empty()) train_config = resolve_config_path(train_config);
    // --run-dir is taken verbatim (not YAML-parsed), so any path works.
    Config config = resolve_config(train_config, train_overrides);
    if (!run_dir_flag.empty()) config.output.run_dir = run_dir_flag;
    if (overwrite_flag) config.output.overwrite = true;
    if (print_config) {
      std::cout << dump_config(config, true);
      return 0;
    }
    if (nproc > 1) {
      if (distributed_env_from_environment()) {
        throw ConfigError("--nproc starts its own workers; it must not be given to a process "
                          "that already has RANK / WORLD_SIZE (torchrun, srun, mpirun)");
      }
      // The same command line without --nproc, once per worker.
      std::vector<std::string> args;
      for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--nproc") {
          ++i;
          continue;
        }
        if (a.rfind("--nproc=", 0) == 0) continue;
        args.push_back(a);
      }
      LaunchOptions lo;
      lo.nproc = nproc;
      lo.grace = std::chrono::milliseconds(
          static_cast<int64_t>(1000.0 * config.training.distributed.timeout_s) + 10000);
      const std::string exe = fs::read_symlink("/proc/self/exe").string();
      return launch_local_workers(exe, args, lo, std::cerr);
    }
    std::string command_line;
    for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + shell_quote(argv[i]);
    const TrainResult r = run_training(config, std::cout, std::cerr, command_line, resume);
    // Stopped by SIGINT / SIGTERM: 128 + signal (130 / 143), as a shell reports it.
    if (r.stopped) return kExitSignalBase + r.signal;
    return kExitOk;
  }
  if (evaluate->parsed()) {
    auto add = [&](const std::string& key, const std::string& v) {
      if (!v.empty()) eval.overrides.push_back("data." + key + "=" + v);
    };
    add("energy_key", e_energy_key);
    add("forces_key", e_forces_key);
    add("stress_key", e_stress_key);
    add("virial_key", e_virial_key);
    add("energy_unit", e_energy_unit);
    add("forces_unit", e_forces_unit);
    add("stress_unit", e_stress_unit);
    if (!e_json.empty()) eval.json_path = e_json;
    if (!e_write.empty()) eval.write_path = e_write;
    if (!e_parity.empty()) eval.parity_path = e_parity;
    run_evaluation(eval, std::cout, std::cerr);
    return 0;
  }
  if (convert_cmd->parsed()) {
    run_convert(convert, std::cout);
    return 0;
  }
  if (import_mace_cmd->parsed()) {
    run_import_mace(import_mace_req, std::cout);
    return 0;
  }
  if (export_mace_cmd->parsed()) {
    run_export_mace(export_mace, std::cout);
    return 0;
  }
  if (export_kim_cmd->parsed()) {
    run_export_kim(export_kim, std::cout);
    return 0;
  }
  if (info->parsed()) {
    run_info(info_path, std::cout);
    return 0;
  }
  if (spec_dump->parsed()) {
    std::cout << config_to_spec_json(resolve_config(spec_config.empty() ? spec_config : resolve_config_path(spec_config), spec_overrides));
    return 0;
  }
  if (spec_validate->parsed()) {
    (void)config_from_spec_json(read_config_text(spec_file, "spec file"), spec_file);
    std::cout << spec_file << ": valid spec\n";
    return 0;
  }
  if (config_cmd->parsed()) {
    if (markdown) {
      std::cout << config_keys_markdown();
      return 0;
    }
    if (dump_default) {
      if (!cfg_file.empty() || !cfg_overrides.empty()) {
        throw ConfigError("--dump-default takes no --config or overrides; drop --dump-default "
                          "to print a resolved config");
      }
      std::cout << dump_config(default_config(), true);
      return 0;
    }
    std::cout << dump_config(resolve_config(cfg_file.empty() ? cfg_file : resolve_config_path(cfg_file), cfg_overrides), true);
    return 0;
  }
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ConfigError& e) {
    std::cerr << kPrefix << e.what() << "\n";
    return kExitBadInput;
  } catch (const DataError& e) {
    std::cerr << kPrefix << e.what() << "\n";
    return kExitBadInput;
  } catch (const DistributedError& e) {
    std::cerr << kPrefix << e.what() << "\n";
    return kExitBadInput;
  } catch (const TrainingError& e) {
    std::cerr << kPrefix << e.what() << "\n";
    return kExitTrainingFault;
  } catch (const YAML::Exception& e) {
    // Normally translated by the config loader; this is the safety net.
    std::cerr << kPrefix << "invalid YAML at line " << e.mark.line + 1 << ": " << e.msg << "\n";
    return kExitBadInput;
  } catch (const std::filesystem::filesystem_error& e) {
    // Issue 47: a file-system failure (a read-only or immutable folder, a
    // folder where a file goes) is the user's to fix: one line, the path and
    // the cause, exit 1.
    std::cerr << kPrefix << filesystem_error_text(e) << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << "crucible: internal error: " << e.what_without_backtrace() << "\n";
    return kExitInternal;
  } catch (const std::exception& e) {
    std::cerr << "crucible: internal error: " << e.what() << "\n";
    return kExitInternal;
  } catch (...) {
    std::cerr << "crucible: internal error: unknown exception\n";
    return kExitInternal;
  }
}

}  // namespace crucible
