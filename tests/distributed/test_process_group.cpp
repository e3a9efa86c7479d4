// Issue 6: launch environment parsing, Gloo collectives over loopback, and a
// dead worker reported by rank within the timeout.

#include "crucible/common/error.h"
#include "crucible/distributed/launcher.h"
#include "crucible/distributed/process_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

namespace crucible {
namespace {

std::function<const char*(const char*)> env_of(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

TEST(DistributedEnv, TorchrunSlurmAndOpenMpiVariables) {
  EXPECT_FALSE(distributed_env_from_environment(env_of({})));
  auto t = distributed_env_from_environment(env_of(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"},
       {"MASTER_PORT", "29555"}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 4);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->master_addr, "node7");
  EXPECT_EQ(t->master_port, 29555);
  EXPECT_EQ(t->source, "torchrun");

  auto s = distributed_env_from_environment(
      env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}}));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->master_port, 29500);
  EXPECT_EQ(s->source, "slurm");

  auto m = distributed_env_from_environment(env_of({{"OMPI_COMM_WORLD_RANK", "0"},
                                                     {"OMPI_COMM_WORLD_SIZE", "2"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->world_size, 2);
  EXPECT_EQ(m->source, "openmpi");
}

void expect_config_error(std::map<std::string, std::string> vars, const std::string& needle) {
  try {
    distributed_env_from_environment(env_of(std::move(vars)));
    FAIL() << "expected ConfigError containing " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DistributedEnv, BadVariablesNameTheVariable) {
  expect_config_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK must be in [0, 2), got 2");
  expect_config_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK must be an integer, got 'x'");
  expect_config_error({{"RANK", "0"}}, "RANK and WORLD_SIZE must be set together");
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}},
                      "MASTER_PORT must be in 1..65535");
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE must be >= 1");
}

DistributedEnv loopback(int rank, int size, int port) {
  DistributedEnv env;
  env.rank = rank;
  env.world_size = size;
  env.master_port = port;
  return env;
}

TEST(ProcessGroup, GlooAllReduceAndBroadcastOverLoopback) {
  const int port = free_local_port();
  std::vector<at::Tensor> sums(2), bcast(2);
  auto worker = [&](int rank) {
    ProcessGroupOptions o;
    o.timeout = std::chrono::seconds(20);
    auto comm = make_process_group(loopback(rank, 2, port), o);
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), 2);
    at::Tensor t = at::arange(4, at::kDouble) * (rank + 1);  // [0,1,2,3] and [0,2,4,6]
    comm->allreduce_sum(t);
    sums[rank] = t;
    at::Tensor b = at::full({3}, rank == 0 ? 7.0 : -1.0, at::kFloat);
    comm->broadcast(b, 0);
    bcast[rank] = b;
    comm->barrier();
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(sums[r].equal(at::arange(4, at::kDouble) * 3)) << sums[r];
    EXPECT_TRUE(bcast[r].equal(at::full({3}, 7.0, at::kFloat))) << bcast[r];
  }
}

TEST(ProcessGroup, ADeadWorkerIsNamedWithinTheTimeout) {
  const int port = free_local_port();
  std::string message;
  double seconds = -1;
  auto worker = [&](int rank) {
    ProcessGroupOptions o;
    o.timeout = std::chrono::seconds(8);
    auto comm = make_process_group(loopback(rank, 2, port), o);
    at::Tensor t = at::ones({2}, at::kDouble);
    comm->allreduce_sum(t);
    if (rank == 1) return;  // "dies": its connections and heartbeat end
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm->allreduce_sum(t);
    } catch (const DistributedError& e) {
      message = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_NE(message.find("rank 0 of 2: all-reduce failed"), std::string::npos) << message;
  EXPECT_NE(message.find("worker rank 1 stopped answering"), std::string::npos) << message;
  EXPECT_GE(seconds, 0.0);
  EXPECT_LT(seconds, 8.0 + 6.0) << "must fail within the timeout (+ the 2.5 s heartbeat check)";
}

}  // namespace
}  // namespace crucible
