// Recipe keys, model.*: type, cutoff, init_from, scaling, shift; each registered model type's own keys come from its factory (crucible/models/registry.h).

#include "../schema.h"

#include "crucible/models/registry.h"

#include <string>
#include <variant>
#include <vector>

namespace crucible::config_schema {

void add_model_keys(KeyTable& t) {
  // model: the type and cutoff here; every other key belongs to a
  // registered model (crucible/models/registry.h) as model.<type>.<name>.
  {
    std::vector<std::string> types;
    std::string listed;
    for (const auto& f : model_registry()) {
      types.push_back(f.type);
      listed += (listed.empty() ? "" : "; ") + f.type + ": " + f.description;
    }
    t.add("model.type", Kind::kString, "",
        "Model architecture; its hyperparameters are the keys model.<type>.*. " + listed + ".",
        [](Config& c) -> void* { return &c.model.type; })
        .choices = types;
  }
  min_excl(t.add("model.cutoff", Kind::kFloat, "\xC3\x85",
               "Neighbor cutoff radius (r_max); interactions vanish smoothly at it.",
               [](Config& c) -> void* { return &c.model.cutoff; }),
           0.0);
  t.add("model.init_from", Kind::kOptString, "",
      "Fine-tuning: start from the weights of this trained model (a run directory, or a model.pt "
      "with model.json beside it) of the same model.type and settings, every parameter whose "
      "shape differs named in an error; or from a MACE file (a _compiled.model, or a .pt with "
      "its hyper-parameters beside it as .json), whose architecture the run takes (a model key "
      "set to another value is refused). The source's energy scale and shift are kept; the E0s "
      "follow data.e0s (foundation keeps the source's). null = random initialization.",
      [](Config& c) -> void* { return &c.model.init_from; });
  t.add("model.scaling", Kind::kString, "",
      "Energy scale of the learned part (MACE --scaling): rms_forces_scaling (RMS of the "
      "training force components), std_scaling (standard deviation of the per-atom residual "
      "energy (E - sum E0)/N) or no_scaling (1). Not with model.init_from (the source's scale "
      "is kept).",
      [](Config& c) -> void* { return &c.model.scaling; })
      .choices = {"rms_forces_scaling", "std_scaling", "no_scaling"};
  t.add("model.shift", Kind::kString, "",
      "Per-atom energy shift of the learned part: mean (mean per-atom residual energy of the "
      "training set, MACE's ScaleShiftMACE) or zero (MACE's default model, whose E0s alone carry "
      "the mean). Not with model.init_from (the source's shift is kept).",
      [](Config& c) -> void* { return &c.model.shift; })
      .choices = {"mean", "zero"};
  for (const auto& f : model_registry()) {
    for (const auto& mk : f.keys) {
      const std::string id = f.type + "." + mk.name;
      Kind kind = Kind::kString;
      if (std::holds_alternative<bool>(mk.default_value)) kind = Kind::kBool;
      if (std::holds_alternative<int64_t>(mk.default_value)) kind = Kind::kInt;
      if (std::holds_alternative<double>(mk.default_value)) kind = Kind::kFloat;
      if (std::holds_alternative<std::vector<int64_t>>(mk.default_value)) kind = Kind::kIntList;
      Key& key = t.add("model." + id, kind, mk.units, mk.doc + " (model.type: " + f.type + ")",
                     [id, kind](Config& c) -> void* {
                       ModelParamValue& v = c.model.params[id];
                       switch (kind) {
                         case Kind::kBool: return &std::get<bool>(v);
                         case Kind::kInt: return &std::get<int64_t>(v);
                         case Kind::kFloat: return &std::get<double>(v);
                         case Kind::kIntList: return &std::get<std::vector<int64_t>>(v);
                         default: return &std::get<std::string>(v);
                       }
                     });
      key.min = mk.min;
      key.min_exclusive = mk.min_exclusive;
      key.choices = mk.choices;
    }
  }
}

}  // namespace crucible::config_schema
