// Launcher placement from environment variables, the local rank threads' placement, and the
// capabilities file round trip + override.
#include "comm/platform.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "comm/capabilities.h"
#include "core/check.h"
#include "core/env.h"
#include "test_util.h"

namespace deepinfer {
namespace {

auto env_of(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const char* name) -> std::optional<std::string> {
    auto it = m.find(name);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Platform, OpenMpiVariables) {
  auto p = launcher_placement(env_of({{"OMPI_COMM_WORLD_RANK", "5"},
                                      {"OMPI_COMM_WORLD_SIZE", "8"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, 5);
  EXPECT_EQ(p->world, 8);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->source, "openmpi");
}

TEST(Platform, PmiAndSlurmVariables) {
  auto pmi = launcher_placement(env_of({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}}));
  ASSERT_TRUE(pmi);
  EXPECT_EQ(pmi->rank, 2);
  EXPECT_EQ(pmi->world, 3);
  EXPECT_EQ(pmi->local_rank, 0);
  EXPECT_EQ(pmi->source, "pmi");
  auto slurm = launcher_placement(
      env_of({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}}));
  ASSERT_TRUE(slurm);
  EXPECT_EQ(slurm->rank, 7);
  EXPECT_EQ(slurm->world, 16);
  EXPECT_EQ(slurm->local_rank, 3);
  // OpenMPI's variables win when several launchers' are present.
  auto both = launcher_placement(env_of({{"SLURM_PROCID", "7"},
                                         {"SLURM_NTASKS", "16"},
                                         {"OMPI_COMM_WORLD_RANK", "1"},
                                         {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(both->source, "openmpi");
}

TEST(Platform, NoLauncherAndBadValues) {
  EXPECT_FALSE(launcher_placement(env_of({})));
  try {
    launcher_placement(env_of({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
    FAIL() << "bad value accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK='x1'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(launcher_placement(env_of({{"PMI_RANK", "4"}, {"PMI_SIZE", "4"}})), Error);
}

TEST(Platform, MultiProcessLaunchFromEachLauncher) {
  EXPECT_FALSE(multi_process_launch(env_of({})));
  // sbatch sets SLURM_NTASKS for the batch script's single process too: not a launch of several.
  EXPECT_FALSE(multi_process_launch(env_of({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}})));
  for (const char* var :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    auto l = multi_process_launch(env_of({{var, "3"}}));
    ASSERT_TRUE(l) << var;
    EXPECT_EQ(l->processes, 3) << var;
    EXPECT_EQ(l->variable, var);
  }
  EXPECT_THROW(multi_process_launch(env_of({{"PMI_SIZE", "two"}})), Error);
}

TEST(Platform, LauncherKillGraceIsOpenMpisSigkillTimeout) {
  EXPECT_FALSE(launcher_kill_grace_s(env_of({})));                               // no launcher
  EXPECT_FALSE(launcher_kill_grace_s(env_of({{"SLURM_STEP_NUM_TASKS", "4"}})));  // not Open MPI
  // mpirun without --mca odls_base_sigkill_timeout: Open MPI's default, 1 s.
  EXPECT_EQ(launcher_kill_grace_s(env_of({{"OMPI_COMM_WORLD_SIZE", "4"}})), 1.0);
  EXPECT_EQ(launcher_kill_grace_s(env_of(
                {{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_MCA_odls_base_sigkill_timeout", "30"}})),
            30.0);
  try {
    launcher_kill_grace_s(
        env_of({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_MCA_odls_base_sigkill_timeout", "soon"}}));
    FAIL() << "bad value accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_MCA_odls_base_sigkill_timeout='soon'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Platform, ChooseCommTakesMpiUnderALaunchOfSeveralProcesses) {
  const MultiProcessLaunch two{2, "OMPI_COMM_WORLD_SIZE"}, one{1, "OMPI_COMM_WORLD_SIZE"};
  // No launch (or one process): the option, else DEEPINFER_COMM, else the default.
  EXPECT_EQ(choose_comm(std::nullopt, "--comm", std::nullopt, CommKind::local, std::nullopt),
            CommKind::local);
  EXPECT_EQ(choose_comm(CommKind::mpi, "--comm", CommKind::local, CommKind::local, std::nullopt),
            CommKind::mpi);
  EXPECT_EQ(choose_comm(std::nullopt, "--comm", CommKind::mpi, CommKind::local, one),
            CommKind::mpi);
  EXPECT_EQ(choose_comm(CommKind::local, "--comm", std::nullopt, CommKind::local, one),
            CommKind::local);
  // Under mpirun -np 2: mpi unless someone asked for local, which is an error naming who.
  EXPECT_EQ(choose_comm(std::nullopt, "--comm", std::nullopt, CommKind::local, two), CommKind::mpi);
  EXPECT_EQ(choose_comm(CommKind::mpi, "--comm", std::nullopt, CommKind::local, two),
            CommKind::mpi);
  try {
    choose_comm(CommKind::local, "--comm", std::nullopt, CommKind::local, two);
    ADD_FAILURE() << "--comm local under a launch of 2 processes was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--comm local"), std::string::npos) << m;
    EXPECT_NE(m.find("OMPI_COMM_WORLD_SIZE=2"), std::string::npos) << m;
    EXPECT_EQ(m.find("check `"), std::string::npos) << m;
  }
  try {
    choose_comm(std::nullopt, "--comm", CommKind::local, CommKind::local, two);
    ADD_FAILURE() << "DEEPINFER_COMM=local under a launch of 2 processes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DEEPINFER_COMM=local"), std::string::npos) << e.what();
  }
}

TEST(Platform, LocalRankThreadsKnowTheirPlace) {
  std::vector<Placement> seen(6);
  run_ranks(test::local_opts(6), [&](Group& g) { seen[size_t(g.rank())] = current_placement(); });
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(seen[size_t(r)].rank, r);
    EXPECT_EQ(seen[size_t(r)].world, 6);
    EXPECT_EQ(seen[size_t(r)].local_rank, r);
    EXPECT_EQ(seen[size_t(r)].source, "local");
  }
}

TEST(Platform, CpuShareSplitsTheListedCpusIntoContiguousRuns) {
  const std::vector<int> cpus{0, 1, 2, 3,  4,
                              5, 8, 9, 10, 11};  // 10 CPUs, a gap as a cpuset may leave
  // 10 over 4 ranks: 3, 3, 2, 2 — every CPU once, in order.
  std::vector<int> joined;
  for (int r = 0; r < 4; ++r) {
    const std::vector<int> share = cpu_share(cpus, r, 4);
    EXPECT_EQ(share.size(), r < 2 ? 3u : 2u) << r;
    joined.insert(joined.end(), share.begin(), share.end());
  }
  EXPECT_EQ(joined, cpus);
  EXPECT_EQ(cpu_share(cpus, 9, 10), std::vector<int>{11});
  EXPECT_TRUE(cpu_share(cpus, 0, 11).empty());  // more ranks than CPUs: nobody is pinned
  EXPECT_TRUE(cpu_share(cpus, 4, 4).empty());
  EXPECT_TRUE(cpu_share({}, 0, 1).empty());
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Every local rank thread runs on its own share, and the knob turns that off.
TEST(Platform, LocalRankThreadsRunOnTheirShareOfTheCpus) {
  const std::vector<int> cpus = allowed_cpus();
  const Knobs saved = knobs();
  for (bool pin : {true, false}) {
    Knobs k = saved;
    k.pin_ranks = pin;
    set_knobs(k);
    for (int world : {2, int(cpus.size()), int(cpus.size()) + 1}) {
      std::vector<std::vector<int>> seen(static_cast<size_t>(world));
      run_ranks(test::local_opts(world),
                [&](Group& g) { seen[size_t(g.rank())] = allowed_cpus(); });
      for (int r = 0; r < world; ++r) {
        const std::vector<int> expected =
            pin && world <= int(cpus.size()) ? cpu_share(cpus, r, world) : cpus;
        EXPECT_EQ(seen[size_t(r)], expected)
            << "pin " << pin << " world " << world << " rank " << r;
      }
    }
  }
  set_knobs(saved);
  EXPECT_EQ(allowed_cpus(), cpus);  // the calling thread itself stays where it was
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / fmt::format("deepinfer_{}_{}", ::getpid(), name))
      .string();
}

TEST(Capabilities, SaveLoadRoundTrip) {
  const std::string path = temp_path("caps.json");
  save_capabilities(path, Capabilities{true, false, false}, "faulty(a2av-hang)/local");
  const CapabilitiesFile f = load_capabilities(path);
  EXPECT_TRUE(f.caps.all_to_all);
  EXPECT_FALSE(f.caps.all_to_all_v);
  EXPECT_FALSE(f.caps.ordered_reduce);
  EXPECT_EQ(f.backend, "faulty(a2av-hang)/local");
  std::filesystem::remove(path);
}

TEST(Capabilities, BadFilesNameTheProblem) {
  auto expect_error = [](const std::string& content, const std::string& needle) {
    const std::string path = temp_path("bad.json");
    std::ofstream(path) << content;
    try {
      load_capabilities(path);
      ADD_FAILURE() << "accepted: " << content;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
  };
  expect_error("{\"all_to_all\": 1}", "\"all_to_all\" must be true or false");
  expect_error("{\"all_to_al\": true}", "unknown field \"all_to_al\"");
  expect_error("not json", "not valid JSON");
  EXPECT_THROW(load_capabilities(temp_path("missing.json")), Error);
}

TEST(Capabilities, KnobOverridesTheGroupsCapabilities) {
  const std::string path = temp_path("override.json");
  save_capabilities(path, Capabilities{false, false, true}, "local");
  const Knobs saved = knobs();
  Knobs k = saved;
  k.capabilities_file = path;
  set_knobs(k);
  run_ranks(test::local_opts(2), [](Group& g) {
    EXPECT_FALSE(g.capabilities().all_to_all);
    EXPECT_FALSE(g.capabilities().all_to_all_v);
    EXPECT_EQ(g.backend(), "local");
    int32_t x = g.rank(), y[2];
    g.all_gather(&x, y, 1, DType::i32);  // still a working group
    EXPECT_EQ(y[1], 1);
  });
  set_knobs(saved);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace deepinfer
