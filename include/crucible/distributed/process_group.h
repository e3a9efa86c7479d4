#pragma once
// Process groups from the launch environment (issue 6): torchrun-style
// variables, SLURM or Open MPI; c10d TCPStore + ProcessGroupGloo (CPU) or
// ProcessGroupNCCL (CUDA builds with USE_C10D_NCCL).

#include "crucible/distributed/communicator.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace crucible {

/// Where this worker sits in the world, and how to reach the store.
struct DistributedEnv {
  int rank = 0;                          ///< global rank.
  int world_size = 1;                    ///< number of workers.
  int local_rank = 0;                    ///< rank on this machine (GPU index).
  std::string master_addr = "127.0.0.1"; ///< host of rank 0's TCPStore.
  int master_port = 29500;               ///< its port.
  std::string source;                    ///< "torchrun", "slurm", "openmpi" or "none".
};

/// Reads the world from environment variables, in this order:
///  1. torchrun: RANK, WORLD_SIZE (both required together), LOCAL_RANK
///     (default 0), MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500);
///  2. SLURM: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun);
///  3. Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
///     OMPI_COMM_WORLD_LOCAL_RANK (mpirun).
/// For 2 and 3, MASTER_ADDR / MASTER_PORT still name the store (defaults as in 1).
/// Returns nullopt when none is set. `getenv` is injectable for tests.
/// @throws ConfigError naming the variable for a non-integer value, a rank
///   outside [0, world size), a world size < 1, a port outside 1..65535,
///   or RANK without WORLD_SIZE (or the reverse).
std::optional<DistributedEnv> distributed_env_from_environment(
    const std::function<const char*(const char*)>& getenv = {});

/// Options of make_process_group.
struct ProcessGroupOptions {
  std::string backend = "auto";  ///< "gloo", "nccl", or "auto" (nccl for CUDA devices, else gloo).
  bool cuda = false;             ///< training runs on CUDA (for "auto").
  /// Collectives and store operations waiting longer fail. Default 120 s.
  std::chrono::milliseconds timeout{120000};
};

/// Connects this worker: rank 0 hosts a c10d TCPStore on master_port, the
/// others connect to it; then a Gloo (or NCCL) process group. Each worker
/// also publishes a heartbeat in the store once per second, so that a
/// failed collective can name the workers that stopped answering.
/// @throws ConfigError for an unknown or unavailable backend;
///   DistributedError when the store or group cannot be formed in time.
std::shared_ptr<Communicator> make_process_group(const DistributedEnv& env,
                                                 const ProcessGroupOptions& options = {});

}  // namespace crucible
