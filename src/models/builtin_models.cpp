// The built-in architectures: one line per model (issue 16). Each factory
// lives in its model's folder (src/models/<type>/).

#include "crucible/models/registry.h"

namespace crucible {

ModelFactory schnet_factory();  // src/models/schnet/schnet_factory.cpp
ModelFactory mace_factory();    // src/models/mace/mace_factory.cpp

std::vector<ModelFactory> builtin_models() { return {schnet_factory(), mace_factory()}; }

}  // namespace crucible
