// Where this process sits in the job, from whichever launcher started it.
#include <cstdlib>
#include <string>

#include "train/trainer.hpp"
#include "util/error.hpp"

namespace tessera {

namespace {

int64_t env_int(const char *name, int64_t fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v) return fallback;
  char *end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < 0)
    throw Error(TSR_ERR_CONFIG, std::string("environment variable ") + name + "='" + v +
                                    "' is not a non-negative integer");
  return x;
}

}  // namespace

ProcessInfo process_info(int cli_local_rank) {
  ProcessInfo p;
  // Our launcher and torchrun: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE;
  // mpirun: OMPI_COMM_WORLD_*; Slurm: SLURM_PROCID/NTASKS/LOCALID.
  if (std::getenv("RANK") || std::getenv("WORLD_SIZE")) {
    p.rank = static_cast<uint32_t>(env_int("RANK", 0));
    p.world_size = static_cast<uint32_t>(env_int("WORLD_SIZE", 1));
    p.local_rank = static_cast<uint32_t>(env_int("LOCAL_RANK", p.rank));
    p.local_world_size = static_cast<uint32_t>(env_int("LOCAL_WORLD_SIZE", p.world_size));
  } else if (std::getenv("OMPI_COMM_WORLD_RANK")) {
    p.rank = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_RANK", 0));
    p.world_size = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_SIZE", 1));
    p.local_rank = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0));
    p.local_world_size = static_cast<uint32_t>(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", p.world_size));
  } else if (std::getenv("SLURM_PROCID")) {
    p.rank = static_cast<uint32_t>(env_int("SLURM_PROCID", 0));
    p.world_size = static_cast<uint32_t>(env_int("SLURM_NTASKS", 1));
    p.local_rank = static_cast<uint32_t>(env_int("SLURM_LOCALID", 0));
    p.local_world_size = static_cast<uint32_t>(env_int("SLURM_NTASKS_PER_NODE", 1));
  } else {
    p.local_rank = static_cast<uint32_t>(env_int("LOCAL_RANK", 0));
  }
  // --local_rank (DeepSpeed's launcher passes it with LOCAL_RANK set to the
  // same) must agree with the launcher's variable; alone, it is the rank.
  if (cli_local_rank >= 0) {
    const char *env = std::getenv("LOCAL_RANK");
    if (env && *env && env_int("LOCAL_RANK", 0) != cli_local_rank)
      throw Error(TSR_ERR_CONFIG, "--local_rank " + std::to_string(cli_local_rank) +
                                      " disagrees with LOCAL_RANK=" + env +
                                      " from the launcher; give one of them");
    p.local_rank = static_cast<uint32_t>(cli_local_rank);
  }

  if (p.world_size == 0) throw Error(TSR_ERR_CONFIG, "WORLD_SIZE is 0");
  if (p.rank >= p.world_size)
    throw Error(TSR_ERR_CONFIG, "RANK " + std::to_string(p.rank) + " is not below WORLD_SIZE " +
                                    std::to_string(p.world_size));
  return p;
}

}  // namespace tessera
