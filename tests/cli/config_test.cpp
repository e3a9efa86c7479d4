// Config schema: loading, type checks, unknown keys, overrides, units, dump.

#include "crucible/common/error.h"
#include "crucible/config/config.h"
#include "crucible/training/lr_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace crucible {
namespace {

/// Runs `fn`, expects a ConfigError, returns its message.
template <class Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ConfigError";
  return "";
}

Config from_yaml(const std::string& text) {
  Config c = default_config();
  apply_config_yaml(c, text, "cfg.yaml");
  return c;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Config, DefaultsAreValid) {
  const Config c = default_config();
  EXPECT_NO_THROW(validate_config(c));
  EXPECT_EQ(c.data.train_file, "data/alloy_TiAl/TiAl_tutorial.xyz");
  EXPECT_TRUE(c.training.num_epochs.has_value());
  EXPECT_FALSE(c.training.num_steps.has_value());
  EXPECT_EQ(c.model.type, "schnet");
  EXPECT_EQ(c.data.energy_unit.factor, 1.0);
}

TEST(Config, EmptyDocumentKeepsDefaults) {
  EXPECT_EQ(from_yaml(""), default_config());
  EXPECT_EQ(from_yaml("# only a comment\n"), default_config());
  EXPECT_EQ(from_yaml("training:\n"), default_config());
}

TEST(Config, LoadsNestedValues) {
  const Config c = from_yaml(
      "data:\n  train_file: foo.xyz\n  valid_file: bar.xyz\n  energy_key: REF_energy\n"
      "model:\n  cutoff: 4.5\n  schnet:\n    hidden_channels: 16\n"
      "training:\n  batch_size: 3\n  optimizer:\n    name: adamw\n    lr: 1e-2\n"
      "    amsgrad: true\n  loss:\n    forces_weight: 100\n  dtype: float32\n"
      "output:\n  run_dir: runs/x\n  overwrite: yes\n");
  EXPECT_EQ(c.data.train_file, "foo.xyz");
  EXPECT_EQ(c.data.valid_file.value(), "bar.xyz");
  EXPECT_EQ(c.data.energy_key, "REF_energy");
  EXPECT_DOUBLE_EQ(c.model.cutoff, 4.5);
  EXPECT_EQ(std::get<int64_t>(c.model.params.at("schnet.hidden_channels")), 16);
  EXPECT_EQ(c.training.batch_size, 3);
  EXPECT_EQ(c.training.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 0.01);
  EXPECT_TRUE(c.training.optimizer.amsgrad);
  EXPECT_DOUBLE_EQ(c.training.loss.forces_weight, 100.0);
  EXPECT_EQ(c.training.dtype, "float32");
  EXPECT_EQ(c.output.run_dir.value(), "runs/x");
  EXPECT_TRUE(c.output.overwrite);
  EXPECT_NO_THROW(validate_config(c));
}

TEST(Config, UnknownKeyRejectedWithFullPathAndLine) {
  const std::string msg = config_error([] {
    from_yaml("training:\n  num_epochs: 3\n  optimiser:\n    lr: 0.1\n");
  });
  EXPECT_NE(msg.find("unknown config key 'training.optimiser' in cfg.yaml (line 3)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("known keys: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.optimizer"), std::string::npos) << msg;

  const std::string nested = config_error([] { from_yaml("training:\n  optimizer:\n    lrr: 1\n"); });
  EXPECT_NE(nested.find("unknown config key 'training.optimizer.lrr' in cfg.yaml (line 3)"),
            std::string::npos)
      << nested;
  EXPECT_NE(nested.find("training.optimizer.lr"), std::string::npos) << nested;

  const std::string top = config_error([] { from_yaml("datasets:\n  x: 1\n"); });
  EXPECT_NE(top.find("unknown config key 'datasets' in cfg.yaml (line 1)"), std::string::npos)
      << top;
}

TEST(Config, WrongTypeRejectedWithPathAndExpectedType) {
  std::string msg = config_error([] { from_yaml("training:\n  num_epochs: abc\n"); });
  EXPECT_NE(msg.find("training.num_epochs must be an integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'abc'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;

  msg = config_error([] { from_yaml("training:\n  batch_size: 2.5\n"); });
  EXPECT_NE(msg.find("training.batch_size must be an integer"), std::string::npos) << msg;

  msg = config_error([] { from_yaml("training:\n  optimizer:\n    lr: [1, 2]\n"); });
  EXPECT_NE(msg.find("training.optimizer.lr must be a number, got a list"), std::string::npos)
      << msg;

  msg = config_error([] { from_yaml("training:\n  optimizer:\n    lr: \"0.01\"\n"); });
  EXPECT_NE(msg.find("training.optimizer.lr must be a number, got the string '0.01'"),
            std::string::npos)
      << msg;

  msg = config_error([] { from_yaml("training:\n  optimizer:\n    amsgrad: maybe\n"); });
  EXPECT_NE(msg.find("training.optimizer.amsgrad must be a boolean"), std::string::npos) << msg;

  msg = config_error([] { from_yaml("data:\n  train_file: {a: 1}\n"); });
  EXPECT_NE(msg.find("data.train_file must be a string, got a mapping"), std::string::npos) << msg;

  msg = config_error([] { from_yaml("training: 5\n"); });
  EXPECT_NE(msg.find("training must be a mapping"), std::string::npos) << msg;

  msg = config_error([] { from_yaml("training:\n  dtype: float16\n"); });
  EXPECT_NE(msg.find("training.dtype must be one of float32, float64, got 'float16'"),
            std::string::npos)
      << msg;
}

TEST(Config, OutOfRangeRejected) {
  std::string msg = config_error([] { from_yaml("training:\n  optimizer:\n    lr: -1\n"); });
  EXPECT_NE(msg.find("training.optimizer.lr must be a number > 0, got -1"), std::string::npos)
      << msg;
  msg = config_error([] { from_yaml("training:\n  batch_size: 0\n"); });
  EXPECT_NE(msg.find("training.batch_size must be an integer >= 1, got 0"), std::string::npos)
      << msg;
  msg = config_error([] { from_yaml("data:\n  valid_fraction: 1.5\n"); });
  EXPECT_NE(msg.find("data.valid_fraction must be a number in (0, 1), got 1.5"),
            std::string::npos)
      << msg;
  msg = config_error([] { from_yaml("model:\n  cutoff: 0\n"); });
  EXPECT_NE(msg.find("model.cutoff must be a number > 0, got 0"), std::string::npos) << msg;
}

TEST(Config, UpdateHookKeys) {
  const Config d = default_config();
  EXPECT_EQ(d.training.gradient_accumulation_steps, 1);
  EXPECT_FALSE(d.training.spike_skipping.enabled);
  EXPECT_FALSE(d.training.ema.enabled);
  Config c = default_config();
  apply_overrides(c, {"training.gradient_accumulation_steps=4",
                      "training.spike_skipping.enabled=true", "training.spike_skipping.k=5",
                      "training.spike_skipping.window=20", "training.spike_skipping.min_history=5",
                      "training.ema.enabled=true", "training.ema.decay=0.99",
                      "training.ema.update_every=2", "training.ema.start_step=10"});
  EXPECT_NO_THROW(validate_config(c));
  EXPECT_EQ(c.training.gradient_accumulation_steps, 4);
  EXPECT_TRUE(c.training.spike_skipping.enabled);
  EXPECT_EQ(c.training.spike_skipping.k, 5.0);
  EXPECT_EQ(c.training.spike_skipping.window, 20);
  EXPECT_EQ(c.training.spike_skipping.min_history, 5);
  EXPECT_TRUE(c.training.ema.enabled);
  EXPECT_EQ(c.training.ema.decay, 0.99);
  EXPECT_EQ(c.training.ema.update_every, 2);
  EXPECT_EQ(c.training.ema.start_step, 10);
  std::string msg =
      config_error([] { from_yaml("training:\n  gradient_accumulation_steps: 0\n"); });
  EXPECT_NE(msg.find("training.gradient_accumulation_steps must be an integer in [1, 1000000], got 0"),
            std::string::npos)
      << msg;
  msg = config_error([] { from_yaml("training:\n  ema:\n    decay: 1\n"); });
  EXPECT_NE(msg.find("training.ema.decay must be a number in [0, 1), got 1"), std::string::npos)
      << msg;
  Config bad = from_yaml("training:\n  spike_skipping:\n    window: 5\n    min_history: 6\n");
  msg = config_error([&] { validate_config(bad); });
  EXPECT_EQ(msg,
            "training.spike_skipping.min_history must be <= training.spike_skipping.window (5), "
            "got 6");
}

TEST(Config, SchedulerKeysAndOptionsOfOtherSchedules) {
  Config c = default_config();
  apply_overrides(c, {"training.scheduler.name=plateau", "training.scheduler.monitor=val/energy_mae",
                      "training.scheduler.patience=3", "training.scheduler.factor=0.5"});
  EXPECT_NO_THROW(validate_config(c));
  const SchedulerConfig sc = scheduler_config(c.training.scheduler);
  EXPECT_EQ(sc.name, "plateau");
  EXPECT_EQ(sc.plateau.monitor, "val/energy_mae");
  EXPECT_EQ(sc.plateau.patience, 3);
  EXPECT_EQ(sc.plateau.factor, 0.5);
  EXPECT_EQ(sc.t_max, 0);  // the anneal spans the run
  // An option the chosen schedule does not use is an error, not ignored.
  Config bad = from_yaml("training:\n  scheduler:\n    name: cosine\n    patience: 3\n");
  std::string msg = config_error([&] { validate_config(bad); });
  EXPECT_EQ(msg,
            "training.scheduler.patience is used only by the plateau schedule; it must keep its "
            "default with training.scheduler.name = cosine");
  bad = from_yaml("training:\n  scheduler:\n    name: plateau\n    warmup_steps: 10\n");
  msg = config_error([&] { validate_config(bad); });
  EXPECT_EQ(msg,
            "training.scheduler.warmup_steps is used only by the constant, cosine, step, "
            "exponential schedules; it must keep its default with training.scheduler.name = "
            "plateau");
  msg = config_error([] { from_yaml("training:\n  scheduler:\n    name: linear\n"); });
  EXPECT_NE(msg.find("training.scheduler.name must be one of constant, cosine, step, "
                     "exponential, plateau, got 'linear'"),
            std::string::npos)
      << msg;
}

// Issue 4 acceptance: every file of tests/cli/bad_configs/ (first line
// "# expect: <message>") is rejected before training, by loading and
// validating the config, with that message naming the key.
TEST(Config, BadConfigCatalogIsRejectedNamingTheKey) {
  const std::string dir = std::string(CRUCIBLE_SOURCE_DIR) + "/tests/cli/bad_configs";
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 15u);
  for (const auto& file : files) {
    const std::string text = read_text(file);
    const std::string tag = "# expect: ";
    ASSERT_EQ(text.rfind(tag, 0), 0u) << file << " must start with '" << tag << "'";
    const std::string expected = text.substr(tag.size(), text.find('\n') - tag.size());
    const std::string msg = config_error([&] { validate_config(load_config_file(file)); });
    EXPECT_NE(msg.find(expected), std::string::npos)
        << file << "\n  expected: " << expected << "\n  got:      " << msg;
  }
}

// Issue 5 deliverable 5: the recipe as a JSON spec. to spec, text, from
// spec, to spec is the identity; bad specs are rejected naming the key path.
TEST(Spec, RoundTripAndErrorsNameTheKey) {
  Config c = default_config();
  apply_overrides(c, {"training.num_steps=123", "training.optimizer.name=sgd",
                      "training.optimizer.momentum=0.9", "training.loss.kind=huber",
                      "training.loss.config_type_weights={bulk: 2.5}", "data.energy_unit=kcal/mol",
                      "training.precision=bf16-mixed", "output.run_dir=some/dir"});
  validate_config(c);
  const std::string spec = config_to_spec_json(c);
  const Config back = config_from_spec_json(spec, "spec.json");
  EXPECT_TRUE(back == c);
  EXPECT_EQ(config_to_spec_json(back), spec);
  EXPECT_EQ(back.training.num_steps.value(), 123);
  EXPECT_FALSE(back.training.num_epochs.has_value());
  EXPECT_EQ(back.training.loss.config_type_weights.at("bulk"), 2.5);
  EXPECT_NE(spec.find("\"format\": \"crucible-spec\""), std::string::npos);

  auto error = [](const std::string& text) {
    return config_error([&] { config_from_spec_json(text, "bad.json"); });
  };
  std::string msg = error(R"({"format": "crucible-spec", "spec_version": 1,
    "config": {"training": {"optimizer": {"lrr": 0.1}}}})");
  EXPECT_NE(msg.find("unknown config key 'training.optimizer.lrr' in bad.json (line 2)"),
            std::string::npos)
      << msg;
  msg = error(R"({"format": "crucible-spec", "spec_version": 1,
    "config": {"training": {"batch_size": "four"}}})");
  EXPECT_NE(msg.find("training.batch_size must be an integer, got the string 'four' in "
                     "bad.json (line 2)"),
            std::string::npos)
      << msg;
  msg = error(R"({"format": "crucible-spec", "spec_version": 2, "config": {}})");
  EXPECT_EQ(msg, "bad.json: spec_version must be 1, got 2");
  msg = error(R"({"format": "crucible-spec", "spec_version": 1, "config": {}, "hooks": []})");
  EXPECT_EQ(msg, "bad.json: unknown spec key 'hooks'; known keys: format, spec_version, config");
  msg = error("{\"format\": ");
  EXPECT_NE(msg.find("bad.json: spec must be valid JSON"), std::string::npos) << msg;
}

TEST(Config, InvalidYamlReportsFileAndLine) {
  const std::string msg = config_error([] { from_yaml("training:\n  batch_size: [1, 2\n"); });
  EXPECT_NE(msg.find("cfg.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
}

TEST(Config, DuplicateKeyRejected) {
  const std::string msg =
      config_error([] { from_yaml("training:\n  batch_size: 2\n  batch_size: 3\n"); });
  EXPECT_NE(msg.find("duplicate config key 'training.batch_size'"), std::string::npos) << msg;
}

TEST(Config, OverridesParsedAsYamlScalars) {
  Config c = default_config();
  apply_overrides(c, {"training.optimizer.lr=0.01", "training.num_epochs=3", "model.cutoff=4.5",
                      "data.train_file=foo.xyz", "training.optimizer.amsgrad=true",
                      "data.energy_unit=kcal/mol", "output.run_dir=runs/a b"});
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 0.01);
  EXPECT_EQ(c.training.num_epochs.value(), 3);
  EXPECT_DOUBLE_EQ(c.model.cutoff, 4.5);
  EXPECT_EQ(c.data.train_file, "foo.xyz");
  EXPECT_TRUE(c.training.optimizer.amsgrad);
  EXPECT_EQ(c.data.energy_unit.name, "kcal/mol");
  EXPECT_EQ(c.output.run_dir.value(), "runs/a b");
  EXPECT_NO_THROW(validate_config(c));

  apply_overrides(c, {"data.valid_file=bar.xyz"});
  EXPECT_EQ(c.data.valid_file.value(), "bar.xyz");
  apply_overrides(c, {"data.valid_file="});  // empty value = null
  EXPECT_FALSE(c.data.valid_file.has_value());
}

TEST(Config, OverrideErrors) {
  std::string msg = config_error([] {
    Config c = default_config();
    apply_overrides(c, {"training.optimiser.lr=0.01"});
  });
  EXPECT_NE(msg.find("unknown config key 'training.optimiser' in command-line override "
                     "'training.optimiser.lr=0.01'"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("training.optimizer"), std::string::npos) << msg;

  msg = config_error([] {
    Config c = default_config();
    apply_overrides(c, {"training.num_epochs"});
  });
  EXPECT_NE(msg.find("key.path=value"), std::string::npos) << msg;

  msg = config_error([] {
    Config c = default_config();
    apply_overrides(c, {"training.batch_size=four"});
  });
  EXPECT_NE(msg.find("training.batch_size must be an integer, got 'four'"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("command-line override 'training.batch_size=four'"), std::string::npos)
      << msg;

  msg = config_error([] {
    Config c = default_config();
    apply_overrides(c, {"training=3"});
  });
  EXPECT_NE(msg.find("training must be a mapping"), std::string::npos) << msg;
}

TEST(Config, NumEpochsAndNumStepsAreExclusive) {
  std::string msg = config_error([] { from_yaml("training:\n  num_epochs: 3\n  num_steps: 10\n"); });
  EXPECT_NE(msg.find("training.num_epochs and training.num_steps must not both be set"),
            std::string::npos)
      << msg;
  msg = config_error([] {
    Config c = default_config();
    apply_overrides(c, {"training.num_epochs=3", "training.num_steps=10"});
  });
  EXPECT_NE(msg.find("must not both be set"), std::string::npos) << msg;

  // Setting one unsets the other.
  Config c = default_config();
  apply_overrides(c, {"training.num_steps=10"});
  EXPECT_FALSE(c.training.num_epochs.has_value());
  EXPECT_EQ(c.training.num_steps.value(), 10);
  EXPECT_NO_THROW(validate_config(c));
  Config d = from_yaml("training:\n  num_steps: 7\n");
  EXPECT_FALSE(d.training.num_epochs.has_value());

  // Neither: caught by validation.
  Config e = from_yaml("training:\n  num_epochs: null\n");
  msg = config_error([&] { validate_config(e); });
  EXPECT_NE(msg.find("exactly one of training.num_epochs or training.num_steps"),
            std::string::npos)
      << msg;
}

TEST(Config, NamedUnits) {
  Config c = from_yaml(
      "data:\n  energy_unit: kcal/mol\n  forces_unit: kcal/mol/Å\n  stress_unit: GPa\n");
  EXPECT_NEAR(c.data.energy_unit.factor, 0.0433641043, 1e-10);
  EXPECT_NEAR(c.data.forces_unit.factor, 0.0433641043, 1e-10);
  EXPECT_NEAR(c.data.stress_unit.factor, 1.0 / 160.2176634, 1e-12);
  EXPECT_EQ(c.data.energy_unit.name, "kcal/mol");

  const double kHartree = 27.211386245988, kBohr = 0.529177210903;
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kEnergy, "Hartree"), kHartree, 1e-12);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kEnergy, "hartree"), kHartree, 1e-12);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kEnergy, "Ry"), kHartree / 2, 1e-12);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kEnergy, "kJ/mol"), 0.0103642697, 1e-10);
  EXPECT_EQ(*named_unit_factor(UnitQuantity::kEnergy, "eV"), 1.0);
  EXPECT_EQ(*named_unit_factor(UnitQuantity::kForces, "eV/Å"), 1.0);
  EXPECT_EQ(*named_unit_factor(UnitQuantity::kForces, "eV/A"), 1.0);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kForces, "kcal/mol/A"), 0.0433641043, 1e-10);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kForces, "Hartree/Bohr"), kHartree / kBohr, 1e-10);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kStress, "eV/Å^3"), 1.0, 0);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kStress, "kbar"), 0.1 / 160.2176634, 1e-12);
  EXPECT_NEAR(*named_unit_factor(UnitQuantity::kStress, "Hartree/Bohr^3"),
              kHartree / (kBohr * kBohr * kBohr), 1e-9);
  EXPECT_FALSE(named_unit_factor(UnitQuantity::kForces, "kcal/mol").has_value());
  EXPECT_FALSE(named_unit_factor(UnitQuantity::kEnergy, "eV/Å").has_value());

  // A number is a multiplier.
  Config n = from_yaml("data:\n  energy_unit: 0.5\n");
  EXPECT_EQ(n.data.energy_unit.factor, 0.5);
  EXPECT_TRUE(n.data.energy_unit.name.empty());

  std::string msg = config_error([] { from_yaml("data:\n  energy_unit: furlongs\n"); });
  EXPECT_NE(msg.find("data.energy_unit must be a number > 0 or a unit name"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("kcal/mol"), std::string::npos) << msg;
  msg = config_error([] { from_yaml("data:\n  forces_unit: kcal/mol\n"); });
  EXPECT_NE(msg.find("data.forces_unit must be"), std::string::npos) << msg;
  msg = config_error([] { from_yaml("data:\n  energy_unit: -2\n"); });
  EXPECT_NE(msg.find("data.energy_unit must be"), std::string::npos) << msg;
}

TEST(Config, DumpLoadRoundTrip) {
  const Config d = default_config();
  EXPECT_EQ(from_yaml(dump_config(d, true)), d);
  EXPECT_EQ(from_yaml(dump_config(d, false)), d);

  Config c = default_config();
  apply_overrides(c, {"training.num_steps=123", "data.valid_file=v \"q\".xyz",
                      "data.energy_unit=0.1234567890123", "data.forces_unit=Hartree/Bohr",
                      "training.optimizer.lr=3e-4", "output.run_dir=x", "model.cutoff=4.25",
                      "training.optimizer.eps=1e-12", "training.loss.energy_per_atom=false"});
  const Config back = from_yaml(dump_config(c, true));
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.data.valid_file.value(), "v \"q\".xyz");
  EXPECT_FALSE(back.training.num_epochs.has_value());
  EXPECT_EQ(back.data.energy_unit.factor, 0.1234567890123);
}

TEST(Config, BundledDefaultYamlMatchesDefaults) {
  const std::string path = std::string(CRUCIBLE_SOURCE_DIR) + "/configs/default.yaml";
  const Config c = load_config_file(path);
  EXPECT_EQ(c, default_config());
  // The file is the dump of the defaults (regenerate with `crucible config --dump-default`).
  EXPECT_EQ(read_text(path), dump_config(default_config(), true));
}

TEST(Config, EthanolConfigLoads) {
  const Config c = load_config_file(std::string(CRUCIBLE_SOURCE_DIR) + "/configs/ethanol.yaml");
  EXPECT_NO_THROW(validate_config(c));
  EXPECT_EQ(c.data.train_file, "data/molecular_ethanol_rmd17/ethanol_reduced_100.xyz");
  EXPECT_EQ(c.data.energy_unit.name, "kcal/mol");
  EXPECT_NEAR(c.data.forces_unit.factor, 0.0433641043, 1e-10);
}

// Issue 16: the MACE recipe with the reference code's values, and the
// model registry's keys in the config layer.
TEST(Config, MaceConfigLoadsWithTheReferenceHyperparameters) {
  const Config c = load_config_file(std::string(CRUCIBLE_SOURCE_DIR) + "/configs/mace.yaml");
  EXPECT_NO_THROW(validate_config(c));
  EXPECT_EQ(c.model.type, "mace");
  EXPECT_EQ(std::get<std::string>(c.model.params.at("mace.hidden_irreps")), "32x0e+32x1o");
  EXPECT_EQ(std::get<int64_t>(c.model.params.at("mace.correlation")), 3);
  EXPECT_EQ(std::get<std::vector<int64_t>>(c.model.params.at("mace.radial_mlp")), (std::vector<int64_t>{64, 64, 64}));
  EXPECT_TRUE(c.training.optimizer.amsgrad);
  EXPECT_DOUBLE_EQ(c.training.loss.forces_weight, 100.0);
  // Lists: YAML flow sequences on the command line, ranges per entry.
  Config d = c;
  apply_overrides(d, {"model.mace.radial_mlp=[16, 8]"});
  EXPECT_EQ(std::get<std::vector<int64_t>>(d.model.params.at("mace.radial_mlp")), (std::vector<int64_t>{16, 8}));
  try {
    apply_overrides(d, {"model.mace.radial_mlp=[16, 0]"});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.mace.radial_mlp entries must be integers >= 1, got 0"), std::string::npos) << e.what();
  }
  try {
    apply_overrides(d, {"model.mace.radial_mlp=64"});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.mace.radial_mlp must be a list of integers"), std::string::npos)
        << e.what();
  }
  // An old flat SchNet key names its new place.
  Config e = default_config();
  try {
    apply_overrides(e, {"model.num_filters=8"});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("moved to model.schnet.num_filters"), std::string::npos) << err.what();
  }
  // The spec round trip keeps the list.
  EXPECT_EQ(config_from_spec_json(config_to_spec_json(c), "test"), c);
}

TEST(Config, EveryKeyIsDocumented) {
  const std::string docs = read_text(std::string(CRUCIBLE_SOURCE_DIR) + "/docs/config.md");
  ASSERT_FALSE(docs.empty());
  for (const auto& k : config_keys()) {
    EXPECT_NE(docs.find("`" + k.path + "`"), std::string::npos) << k.path << " not in docs";
    EXPECT_FALSE(k.doc.empty()) << k.path;
  }
  // The reference table is the generated one (regenerate with `crucible config --markdown`).
  EXPECT_NE(docs.find(config_keys_markdown()), std::string::npos)
      << "docs/config.md reference table is stale";
}

TEST(Config, MissingFileIsConfigError) {
  const std::string msg = config_error([] { load_config_file("/nonexistent/cfg.yaml"); });
  EXPECT_NE(msg.find("/nonexistent/cfg.yaml"), std::string::npos) << msg;
}

}  // namespace
}  // namespace crucible
