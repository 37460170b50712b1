// launch_env(): rank, local rank and world from the launcher's environment variables.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "llmc/core/common.h"
#include "llmc/run/runtime.h"

namespace {

const char* const kVars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
                             "SLURM_PROCID",         "SLURM_LOCALID",              "SLURM_NTASKS",
                             "SLURM_STEP_ID"};

// Sets the given variables (name, value pairs) and unsets the other launcher variables, for the
// lifetime of the object.
struct Env {
    explicit Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
        clear();
        for (auto& v : vars) ::setenv(v.first, v.second, 1);
    }
    ~Env() { clear(); }
    static void clear() {
        for (const char* v : kVars) ::unsetenv(v);
    }
};

}  // namespace

TEST_CASE("launch_env: no launcher is one process") {
    Env env({});
    LaunchEnv e = launch_env();
    CHECK(e.launcher.empty());
    CHECK((e.rank == 0 && e.local_rank == 0 && e.world == 1));
}

TEST_CASE("launch_env: mpirun's OMPI_COMM_WORLD_* win over the SLURM_PROCID=0 every rank inherits inside sbatch") {
    Env env({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "8"},
             {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_ID", "0"}});
    LaunchEnv e = launch_env();
    CHECK(e.launcher == "mpirun");
    CHECK(e.rank == 5);
    CHECK(e.local_rank == 1);
    CHECK(e.world == 8);
}

TEST_CASE("launch_env: srun's SLURM_PROCID/LOCALID/NTASKS in a job step") {
    Env env({{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}});
    LaunchEnv e = launch_env();
    CHECK(e.launcher == "srun");
    CHECK(e.rank == 3);
    CHECK(e.local_rank == 1);
    CHECK(e.world == 4);
}

TEST_CASE("launch_env: a batch script's own SLURM_PROCID=0 and SLURM_NTASKS (no job step) are no launcher") {
    Env env({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}});
    LaunchEnv e = launch_env();
    CHECK(e.launcher.empty());
    CHECK(e.world == 1);
}

TEST_CASE("launch_env: a value that is not a rank is an error naming the variable") {
    {
        Env env({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}});
        CHECK_THROWS_WITH(launch_env(), Catch::Contains("SLURM_PROCID=\"4\""));
    }
    {
        Env env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "two"}});
        CHECK_THROWS_WITH(launch_env(), Catch::Contains("OMPI_COMM_WORLD_SIZE=\"two\""));
    }
}
