// The KIM model driver of Crucible models (issue 17, deliverable 2):
// libcrucible_kim.so, whose create routine crucible_kim_model_driver_create
// the exported KIM items (`crucible export kim`) name. A parameterized
// portable model supplies model.json, model.pt and settings.json (the
// evaluation dtype; float64 where an older export lacks it) as its
// parameter files; this driver loads them and computes energy, forces,
// per-atom energies and the global and per-atom virial for LAMMPS or any
// KIM simulator, with the model's interaction range as influence distance.
// Design: docs/deployment_kim.md; the physics is evaluate_cluster
// (crucible/deploy/cluster.h).

#include "crucible/deploy/kim_settings.h"
#include "crucible/run/model_io.h"
#include "crucible/data/extxyz.h"
#include "crucible/deploy/cluster.h"
#include "crucible/training/allocator.h"

#include "KIM_ModelDriverHeaders.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <unistd.h>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace crucible {
namespace {

/// Sums over this instance's compute calls, written at destroy to the file
/// named by the environment variable CRUCIBLE_KIM_STATS (one line per
/// instance, appended: one per MPI rank) for bench/run_md_scale.py.
struct KimStats {
  int64_t calls = 0;
  double seconds = 0;  ///< wall time inside compute, s.
  int64_t particles = 0, contributing = 0, evaluated = 0, edges = 0;
  /// Per layer, summed over calls: ClusterResult's layer_nodes, layer_edges, layer_pairs.
  std::vector<int64_t> layer_nodes, layer_edges, layer_pairs;

  static void accumulate(std::vector<int64_t>& sum, const std::vector<int64_t>& v) {
    if (sum.size() < v.size()) sum.resize(v.size(), 0);
    for (size_t t = 0; t < v.size(); ++t) sum[t] += v[t];
  }
  void add(int64_t n, int64_t owned, const ClusterResult& r, double s) {
    ++calls;
    seconds += s;
    particles += n;
    contributing += owned;
    evaluated += r.evaluated_atoms;
    edges += r.evaluated_edges;
    accumulate(layer_nodes, r.layer_nodes);
    accumulate(layer_edges, r.layer_edges);
    accumulate(layer_pairs, r.layer_pairs);
  }
  /// "kim_stats pid=... calls=... particles=... contributing=... evaluated=...
  /// edges=... layer_nodes=a,b layer_edges=a,b layer_pairs=a,b seconds=..."
  /// (means per call; "all" where every layer ran on everything; seconds summed).
  std::string line() const {
    const double c = static_cast<double>(std::max<int64_t>(1, calls));
    auto mean = [c](double v) { return fmt::format("{:.1f}", v / c); };
    auto layers = [&](const std::vector<int64_t>& v) {
      std::string out;
      for (int64_t x : v) out += (out.empty() ? "" : ",") + mean(static_cast<double>(x));
      return out.empty() ? std::string("all") : out;
    };
    return fmt::format(
        "kim_stats pid={} calls={} particles={} contributing={} evaluated={} edges={} layer_nodes={} layer_edges={} "
        "layer_pairs={} seconds={:.6f}\n",
        getpid(), calls, mean(static_cast<double>(particles)), mean(static_cast<double>(contributing)),
        mean(static_cast<double>(evaluated)), mean(static_cast<double>(edges)), layers(layer_nodes),
        layers(layer_edges), layers(layer_pairs), seconds);
  }
};

/// What one KIM model instance holds.
struct DriverBuffer {
  LoadedModel loaded;            ///< the model, in settings.json's dtype, eval mode.
  double influence_distance = 0;  ///< Å: the model's interaction range.
  double neighbor_cutoff = 0;     ///< Å: the model's cutoff (the list KIM is asked for).
  /// 0: LAMMPS's lists are asked for the padding particles too, and are
  /// the model's edges (issue 48: no neighbor list of its own each step).
  int will_not_request_padding_neighbors = 0;
  std::vector<int64_t> code_to_z;  ///< KIM species code → atomic number.
  std::string name;                ///< "crucible KIM model (schnet)", for messages.
  KimStats stats;                  ///< what the compute calls did, for CRUCIBLE_KIM_STATS.
};

/// Logs `message` through KIM and to stderr (LAMMPS shows only the latter).
template <class Logger>
void report(Logger* logger, const std::string& message, int line) {
  logger->LogEntry(KIM::LOG_VERBOSITY::error, message, line, __FILE__);
  std::cerr << "ERROR: " << message << "\n";
}

int compute_arguments_create(KIM::ModelCompute const* const, KIM::ModelComputeArgumentsCreate* const create) {
  using namespace KIM::COMPUTE_ARGUMENT_NAME;
  const KIM::SupportStatus optional = KIM::SUPPORT_STATUS::optional;
  return create->SetArgumentSupportStatus(partialEnergy, optional) ||
         create->SetArgumentSupportStatus(partialForces, optional) ||
         create->SetArgumentSupportStatus(partialParticleEnergy, optional) ||
         create->SetArgumentSupportStatus(partialVirial, optional) ||
         create->SetArgumentSupportStatus(partialParticleVirial, optional);
}

int compute_arguments_destroy(KIM::ModelCompute const* const, KIM::ModelComputeArgumentsDestroy* const) { return 0; }

void copy_out(const at::Tensor& t, double* dst) {
  const at::Tensor c = t.contiguous();
  std::memcpy(dst, c.data_ptr<double>(), static_cast<size_t>(c.numel()) * sizeof(double));
}

int compute(KIM::ModelCompute const* const model_compute, KIM::ModelComputeArguments const* const args) {
  DriverBuffer* buffer = nullptr;
  model_compute->GetModelBufferPointer(reinterpret_cast<void**>(&buffer));
  using namespace KIM::COMPUTE_ARGUMENT_NAME;
  int const* n_ptr = nullptr;
  int const* species = nullptr;
  int const* contributing = nullptr;
  double const* coordinates_ptr = nullptr;
  double* energy = nullptr;
  double* forces = nullptr;
  double* particle_energy = nullptr;
  double* virial = nullptr;
  double* particle_virial = nullptr;
  if (args->GetArgumentPointer(numberOfParticles, &n_ptr) || args->GetArgumentPointer(particleSpeciesCodes, &species) ||
      args->GetArgumentPointer(particleContributing, &contributing) ||
      args->GetArgumentPointer(coordinates, &coordinates_ptr) || args->GetArgumentPointer(partialEnergy, &energy) ||
      args->GetArgumentPointer(partialForces, &forces) ||
      args->GetArgumentPointer(partialParticleEnergy, &particle_energy) ||
      args->GetArgumentPointer(partialVirial, &virial) ||
      args->GetArgumentPointer(partialParticleVirial, &particle_virial)) {
    report(model_compute, buffer->name + ": could not get the compute arguments", __LINE__);
    return 1;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = *n_ptr;
    // The simulator's coordinates, read in place (evaluate_cluster copies what it keeps).
    const at::Tensor positions = at::from_blob(const_cast<double*>(coordinates_ptr), {n, 3}, at::kDouble);
    at::Tensor z = at::empty({n}, at::kLong);
    at::Tensor mask = at::empty({n}, at::kBool);
    int64_t* zp = z.data_ptr<int64_t>();
    bool* mp = mask.data_ptr<bool>();
    for (int64_t i = 0; i < n; ++i) {
      zp[i] = buffer->code_to_z.at(static_cast<size_t>(species[i]));
      mp[i] = contributing[i] != 0;
    }
    ClusterOptions options;
    options.particle_energy = particle_energy != nullptr;
    options.virial = virial != nullptr;
    options.particle_virial = particle_virial != nullptr;
    options.min_distance = buffer->loaded.meta.min_distance;
    // LAMMPS's full lists (cutoff + skin, padding particles included).
    const NeighborListSource lists = [args](int64_t particle, int* count, const int** neighbors) {
      if (args->GetNeighborList(0, static_cast<int>(particle), count, neighbors)) {
        throw std::runtime_error("the simulator gave no neighbor list for particle " + std::to_string(particle));
      }
    };
    const ClusterResult r = evaluate_cluster(*buffer->loaded.model, positions, z, mask, lists, options);
    if (energy) *energy = r.energy;
    if (forces) copy_out(r.forces, forces);
    if (particle_energy) copy_out(r.particle_energy, particle_energy);
    if (virial) copy_out(r.virial, virial);
    if (particle_virial) copy_out(r.particle_virial, particle_virial);
    buffer->stats.add(n, mask.sum().item<int64_t>(), r,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } catch (const std::exception& e) {
    report(model_compute, buffer->name + ": " + e.what(), __LINE__);
    return 1;
  }
  return 0;
}

int destroy(KIM::ModelDestroy* const model_destroy) {
  DriverBuffer* buffer = nullptr;
  model_destroy->GetModelBufferPointer(reinterpret_cast<void**>(&buffer));
  if (const char* path = std::getenv("CRUCIBLE_KIM_STATS"); path && *path && buffer->stats.calls > 0) {
    std::ofstream(path, std::ios::app) << buffer->stats.line();
  }
  delete buffer;
  return 0;
}

/// Loads the model from the parameter files (model.json, model.pt and, if
/// present, settings.json, in any order) and casts it to the settings'
/// dtype. @throws DataError / std::runtime_error.
LoadedModel load_from_parameter_files(KIM::ModelDriverCreate* const create) {
  int count = 0;
  create->GetNumberOfParameterFiles(&count);
  std::string const* directory = nullptr;
  create->GetParameterFileDirectoryName(&directory);
  bool json = false, pt = false, settings_file = false;
  for (int k = 0; k < count; ++k) {
    std::string const* basename = nullptr;
    create->GetParameterFileBasename(k, &basename);
    json = json || *basename == "model.json";
    pt = pt || *basename == "model.pt";
    settings_file = settings_file || *basename == kKimSettingsFile;
  }
  if (!json || !pt || directory == nullptr) {
    throw std::runtime_error("the KIM model's parameter files must be model.json and model.pt (from `crucible export kim`), got " +
                             std::to_string(count) + " other files");
  }
  const KimSettings settings =
      settings_file ? read_kim_settings(*directory + "/" + kKimSettingsFile) : KimSettings{};
  LoadedModel loaded = load_model(*directory);
  loaded.model->module().to(settings.dtype);
  loaded.model->module().eval();
  return loaded;
}

/// Keeps this library mapped for the rest of the process (RTLD_NODELETE):
/// the large block cache's code lives here and LibTorch calls it for every
/// CPU tensor, also after KIM closes the driver. False if it cannot.
bool pin_this_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&pin_this_library), &info) == 0 || !info.dli_fname) return false;
  return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != nullptr;
}

}  // namespace
}  // namespace crucible

/// KIM::ModelDriverCreateFunction: metal units (Å, eV), one neighbor list at
/// the model's cutoff, influence distance = the model's interaction range,
/// one species code per element the model was trained on. No Refresh
/// routine: the model publishes no parameters to change (KIM allows Refresh
/// only with parameter pointers).
extern "C" int crucible_kim_model_driver_create(KIM::ModelDriverCreate* const create, KIM::LengthUnit const,
                                                KIM::EnergyUnit const, KIM::ChargeUnit const,
                                                KIM::TemperatureUnit const, KIM::TimeUnit const) {
  using namespace crucible;
  auto buffer = std::make_unique<DriverBuffer>();
  try {
    buffer->loaded = load_from_parameter_files(create);
  } catch (const std::exception& e) {
    report(create, std::string("crucible KIM model: ") + e.what(), __LINE__);
    return 1;
  }
  // Freed memory stays in the process for the next force call, as in the
  // crucible executables (tune_allocator_for_training: glibc's mmap and trim
  // thresholds raised, blocks of 16 MiB or more kept by the large block
  // cache). Under lmp's glibc defaults every step's temporaries were mapped
  // and page-faulted again: 1.29-1.42 s against 0.76-0.81 s for 5 steps of
  // a 2048-atom SchNet (issue 48; issue 19 for the large blocks).
  // CRUCIBLE_DEFAULT_MALLOC=1 in the environment leaves the host's malloc as it is.
  if (pin_this_library()) tune_allocator_for_training();
  EnergyModel& model = *buffer->loaded.model;
  buffer->name = "crucible KIM model (" + buffer->loaded.meta.model_type + ")";
  buffer->neighbor_cutoff = model.cutoff();
  buffer->influence_distance = model.interaction_range();
  int error = create->SetUnits(KIM::LENGTH_UNIT::A, KIM::ENERGY_UNIT::eV, KIM::CHARGE_UNIT::unused,
                               KIM::TEMPERATURE_UNIT::unused, KIM::TIME_UNIT::unused) ||
              create->SetModelNumbering(KIM::NUMBERING::zeroBased);
  int code = 0;
  for (int64_t z : buffer->loaded.meta.atomic_numbers) {
    error = error || create->SetSpeciesCode(KIM::SpeciesName(chemical_symbol(z)), code++);
    buffer->code_to_z.push_back(z);
  }
  create->SetInfluenceDistancePointer(&buffer->influence_distance);
  create->SetNeighborListPointers(1, &buffer->neighbor_cutoff, &buffer->will_not_request_padding_neighbors);
  using namespace KIM::MODEL_ROUTINE_NAME;
  const KIM::LanguageName cpp = KIM::LANGUAGE_NAME::cpp;
  error = error ||
          create->SetRoutinePointer(ComputeArgumentsCreate, cpp, true,
                                    reinterpret_cast<KIM::Function*>(compute_arguments_create)) ||
          create->SetRoutinePointer(Compute, cpp, true, reinterpret_cast<KIM::Function*>(compute)) ||
          create->SetRoutinePointer(ComputeArgumentsDestroy, cpp, true,
                                    reinterpret_cast<KIM::Function*>(compute_arguments_destroy)) ||
          create->SetRoutinePointer(Destroy, cpp, true, reinterpret_cast<KIM::Function*>(destroy));
  if (error) {
    report(create, buffer->name + ": the KIM API refused the model's settings", __LINE__);
    return 1;
  }
  create->SetModelBufferPointer(buffer.release());
  return 0;
}
