// Environment knobs: every knob's valid and invalid values, the error messages, unknown
// DEEPINFER_* names, and the process-wide knobs() / set_knobs().
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"

namespace deepinfer {
namespace {

using Env = std::map<std::string, std::string>;

Knobs parse(const Env& env) {
  return parse_knobs([&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

std::string parse_error(const Env& env) {
  try {
    parse(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Env, DefaultsWhenNothingIsSet) {
  const Knobs k = parse({});
  EXPECT_EQ(k.comm, CommKind::local);
  EXPECT_EQ(k.comm_timeout_s, 60.0);
  EXPECT_EQ(k.ep_algo, EpAlgo::automatic);
  EXPECT_EQ(k.ep_ag_rows, AgRows::max);
  EXPECT_EQ(k.ep_reduce, EpReduce::rs);
  EXPECT_EQ(k.ep_chunk_bytes, size_t(64) << 20);
  EXPECT_EQ(k.ep_combine, CombineMode::exact);
  EXPECT_EQ(k.kernels, KernelBackend::cpu);
  EXPECT_EQ(k.threads, 0);
  EXPECT_TRUE(k.decode_layout);
  EXPECT_FALSE(parse({{"DEEPINFER_DECODE_LAYOUT", "off"}}).decode_layout);
  EXPECT_TRUE(parse({{"DEEPINFER_DECODE_LAYOUT", "on"}}).decode_layout);
  EXPECT_EQ(k.ep_peer_memory, EpPeerMemory::automatic);
  EXPECT_EQ(parse({{"DEEPINFER_EP_PEER_MEMORY", "off"}}).ep_peer_memory, EpPeerMemory::off);
  EXPECT_EQ(parse({{"DEEPINFER_EP_PEER_MEMORY", "on"}}).ep_peer_memory, EpPeerMemory::on);
  EXPECT_EQ(parse({{"DEEPINFER_EP_PEER_MEMORY", "auto"}}).ep_peer_memory, EpPeerMemory::automatic);
  EXPECT_EQ(k.fault, "");
  EXPECT_EQ(k.capabilities_file, "");
  EXPECT_EQ(k.log_level, "info");
  // Empty values mean "unset".
  const Knobs e = parse({{"DEEPINFER_EP_ALGO", ""}, {"DEEPINFER_THREADS", ""}});
  EXPECT_EQ(e.ep_algo, EpAlgo::automatic);
  EXPECT_EQ(e.threads, 0);
}

TEST(Env, EnumKnobsAcceptEveryAllowedValue) {
  EXPECT_EQ(parse({{"DEEPINFER_COMM", "mpi"}}).comm, CommKind::mpi);
  EXPECT_EQ(parse({{"DEEPINFER_COMM", "local"}}).comm, CommKind::local);
  EXPECT_EQ(parse({{"DEEPINFER_EP_ALGO", "ag"}}).ep_algo, EpAlgo::ag);
  EXPECT_EQ(parse({{"DEEPINFER_EP_ALGO", "a2a"}}).ep_algo, EpAlgo::a2a);
  EXPECT_EQ(parse({{"DEEPINFER_EP_ALGO", "auto"}}).ep_algo, EpAlgo::automatic);
  EXPECT_EQ(parse({{"DEEPINFER_EP_AG_ROWS", "cap"}}).ep_ag_rows, AgRows::cap);
  EXPECT_EQ(parse({{"DEEPINFER_EP_AG_ROWS", "max"}}).ep_ag_rows, AgRows::max);
  EXPECT_EQ(parse({{"DEEPINFER_EP_REDUCE", "ar"}}).ep_reduce, EpReduce::ar);
  EXPECT_EQ(parse({{"DEEPINFER_EP_REDUCE", "rs"}}).ep_reduce, EpReduce::rs);
  EXPECT_EQ(parse({{"DEEPINFER_EP_COMBINE", "fast"}}).ep_combine, CombineMode::fast);
  EXPECT_EQ(parse({{"DEEPINFER_EP_COMBINE", "exact"}}).ep_combine, CombineMode::exact);
  EXPECT_EQ(parse({{"DEEPINFER_KERNELS", "host"}}).kernels, KernelBackend::host);
  EXPECT_EQ(parse({{"DEEPINFER_KERNELS", "cpu"}}).kernels, KernelBackend::cpu);
  for (const char* level : {"debug", "info", "warn", "error"})
    EXPECT_EQ(parse({{"DEEPINFER_LOG", level}}).log_level, level);
}

TEST(Env, ToStringRoundTripsThroughTheParser) {
  for (EpAlgo v : {EpAlgo::ag, EpAlgo::a2a, EpAlgo::automatic})
    EXPECT_EQ(parse({{"DEEPINFER_EP_ALGO", std::string(to_string(v))}}).ep_algo, v);
  for (AgRows v : {AgRows::max, AgRows::cap})
    EXPECT_EQ(parse({{"DEEPINFER_EP_AG_ROWS", std::string(to_string(v))}}).ep_ag_rows, v);
  for (EpReduce v : {EpReduce::rs, EpReduce::ar})
    EXPECT_EQ(parse({{"DEEPINFER_EP_REDUCE", std::string(to_string(v))}}).ep_reduce, v);
  for (CombineMode v : {CombineMode::exact, CombineMode::fast})
    EXPECT_EQ(parse({{"DEEPINFER_EP_COMBINE", std::string(to_string(v))}}).ep_combine, v);
  for (KernelBackend v : {KernelBackend::host, KernelBackend::cpu})
    EXPECT_EQ(parse({{"DEEPINFER_KERNELS", std::string(to_string(v))}}).kernels, v);
  for (CommKind v : {CommKind::local, CommKind::mpi})
    EXPECT_EQ(parse({{"DEEPINFER_COMM", std::string(to_string(v))}}).comm, v);
}

TEST(Env, NumericKnobs) {
  EXPECT_EQ(parse({{"DEEPINFER_COMM_TIMEOUT_S", "2.5"}}).comm_timeout_s, 2.5);
  EXPECT_EQ(parse({{"DEEPINFER_COMM_TIMEOUT_S", "600"}}).comm_timeout_s, 600.0);
  EXPECT_EQ(parse({{"DEEPINFER_COMM_TIMEOUT_S", "1e-3"}}).comm_timeout_s, 1e-3);
  EXPECT_EQ(parse({{"DEEPINFER_EP_CHUNK_BYTES", "4096"}}).ep_chunk_bytes, 4096u);
  EXPECT_EQ(parse({{"DEEPINFER_EP_CHUNK_BYTES", "1048577"}}).ep_chunk_bytes, 1048577u);
  EXPECT_EQ(parse({{"DEEPINFER_EP_CHUNK_BYTES", "4K"}}).ep_chunk_bytes, 4096u);
  EXPECT_EQ(parse({{"DEEPINFER_EP_CHUNK_BYTES", "8k"}}).ep_chunk_bytes, 8192u);
  EXPECT_EQ(parse({{"DEEPINFER_EP_CHUNK_BYTES", "64M"}}).ep_chunk_bytes, size_t(64) << 20);
  EXPECT_EQ(parse({{"DEEPINFER_EP_CHUNK_BYTES", "2G"}}).ep_chunk_bytes, size_t(2) << 30);
  EXPECT_EQ(parse({{"DEEPINFER_THREADS", "0"}}).threads, 0);
  EXPECT_EQ(parse({{"DEEPINFER_THREADS", "1"}}).threads, 1);
  EXPECT_EQ(parse({{"DEEPINFER_THREADS", "64"}}).threads, 64);
  EXPECT_TRUE(parse({}).pin_ranks);
  EXPECT_FALSE(parse({{"DEEPINFER_PIN_RANKS", "off"}}).pin_ranks);
  EXPECT_TRUE(parse({{"DEEPINFER_PIN_RANKS", "on"}}).pin_ranks);
}

TEST(Env, FreeStringKnobs) {
  const Knobs k = parse(
      {{"DEEPINFER_FAULT", "kernel:moe:3"}, {"DEEPINFER_CAPABILITIES", "/tmp/caps file.json"}});
  EXPECT_EQ(k.fault, "kernel:moe:3");
  EXPECT_EQ(k.capabilities_file, "/tmp/caps file.json");
}

TEST(Env, ErrorMessageNamesVariableValueAndAllowedValues) {
  EXPECT_EQ(parse_error({{"DEEPINFER_EP_ALGO", "foo"}}),
            "DEEPINFER_EP_ALGO='foo' is not valid; allowed values: ag, a2a, auto");
  EXPECT_EQ(parse_error({{"DEEPINFER_COMM", "nccl"}}),
            "DEEPINFER_COMM='nccl' is not valid; allowed values: local, mpi");
}

// Every knob rejects its bad values, and the message names the variable, the value and the
// allowed values.
TEST(Env, EveryKnobRejectsInvalidValues) {
  const std::map<std::string, std::pair<std::string, std::vector<std::string>>> cases = {
      {"DEEPINFER_COMM", {"local, mpi", {"MPI", "Local", "gloo", " local", "local "}}},
      {"DEEPINFER_COMM_TIMEOUT_S",
       {"number > 0", {"0", "-1", "abc", "5s", "inf", "nan", "1e999", "-0", " "}}},
      {"DEEPINFER_EP_ALGO", {"ag, a2a, auto", {"AG", "all_gather", "automatic", "a2a,ag"}}},
      {"DEEPINFER_EP_AG_ROWS", {"max, cap", {"MAX", "capacity", "1"}}},
      {"DEEPINFER_EP_REDUCE", {"rs, ar", {"RS", "reduce_scatter", "allreduce"}}},
      {"DEEPINFER_EP_CHUNK_BYTES",
       {"integer >= 4096, suffix K/M/G allowed",
        {"4095", "0", "3K", "-4096", "4096.0", "1T", "64MB", "M", "0x1000", "99999999999999999999",
         "17179869184G", " 4096"}}},
      {"DEEPINFER_EP_COMBINE", {"exact, fast", {"EXACT", "approx"}}},
      {"DEEPINFER_EP_PEER_MEMORY", {"auto, on, off", {"ON", "1", "shm", "automatic"}}},
      {"DEEPINFER_KERNELS", {"host, cpu", {"cuda", "CPU", "reference"}}},
      {"DEEPINFER_DECODE_LAYOUT", {"on, off", {"ON", "1", "true", "yes"}}},
      {"DEEPINFER_PIN_RANKS", {"on, off", {"ON", "1", "auto", "cores"}}},
      {"DEEPINFER_THREADS", {"integer >= 0", {"-1", "two", "1.5", "4K", "100000", "+2"}}},
      {"DEEPINFER_LOG", {"debug, info, warn, error", {"warning", "INFO", "trace", "0"}}},
  };
  for (const auto& [name, spec] : cases) {
    const auto& [allowed, bad_values] = spec;
    for (const std::string& bad : bad_values) {
      const std::string msg = parse_error({{name, bad}});
      EXPECT_EQ(msg.rfind(name + "='" + bad + "' is not valid", 0), 0u) << msg;
      EXPECT_NE(msg.find("allowed values: " + allowed), std::string::npos) << msg;
    }
  }
}

TEST(Env, KnobDocsListExactlyTheKnobsTheParserReads) {
  std::set<std::string> read;
  parse_knobs([&](const char* name) -> std::optional<std::string> {
    read.insert(name);
    return std::nullopt;
  });
  std::set<std::string> documented;
  for (const KnobDoc& d : knob_docs()) {
    EXPECT_TRUE(documented.insert(d.name).second) << "duplicate row " << d.name;
    EXPECT_NE(std::string(d.allowed), "") << d.name;
    EXPECT_NE(std::string(d.def), "") << d.name;
    EXPECT_NE(std::string(d.meaning), "") << d.name;
  }
  EXPECT_EQ(read, documented);
  EXPECT_EQ(documented.size(), 15u);
}

TEST(Env, UnknownDeepinferVariablesAreRejected) {
  std::vector<std::string> ok = {"PATH", "HOME", "OMPI_COMM_WORLD_RANK", "DEEPINFER"};
  for (const KnobDoc& d : knob_docs()) ok.push_back(d.name);
  EXPECT_NO_THROW(check_unknown_knobs(ok));

  std::vector<std::string> typo = ok;
  typo.push_back("DEEPINFER_EP_ALG0");
  try {
    check_unknown_knobs(typo);
    ADD_FAILURE() << "DEEPINFER_EP_ALG0 was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown environment variable DEEPINFER_EP_ALG0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean DEEPINFER_EP_ALGO?"), std::string::npos) << msg;
    for (const KnobDoc& d : knob_docs()) EXPECT_NE(msg.find(d.name), std::string::npos) << d.name;
  }
  try {
    check_unknown_knobs(std::vector<std::string>{"DEEPINFER_SOMETHING_ELSE_ENTIRELY"});
    ADD_FAILURE() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DEEPINFER_SOMETHING_ELSE_ENTIRELY"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_unknown_knobs(std::vector<std::string>{"DEEPINFER_"}), Error);
}

// knobs() reads the real environment once; these run in a fresh child process so the
// environment they set is the one parsed.
class EnvProcess : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

[[noreturn]] void exit_with_knobs_result() {
  try {
    const Knobs& k = knobs();
    std::fprintf(stderr, "threads=%d algo=%s\n", k.threads,
                 std::string(to_string(k.ep_algo)).c_str());
    std::_Exit(0);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(3);
  }
}

TEST_F(EnvProcess, KnobsReadsTheRealEnvironment) {
  EXPECT_EXIT(
      {
        setenv("DEEPINFER_THREADS", "3", 1);
        setenv("DEEPINFER_EP_ALGO", "a2a", 1);
        exit_with_knobs_result();
      },
      ::testing::ExitedWithCode(0), "threads=3 algo=a2a");
}

TEST_F(EnvProcess, KnobsRejectsATypoInTheRealEnvironment) {
  EXPECT_EXIT(
      {
        setenv("DEEPINFER_EP_ALG0", "ag", 1);
        exit_with_knobs_result();
      },
      ::testing::ExitedWithCode(3),
      "unknown environment variable DEEPINFER_EP_ALG0 \\(did you mean DEEPINFER_EP_ALGO\\?\\)");
}

TEST_F(EnvProcess, KnobsRejectsAnInvalidValueInTheRealEnvironment) {
  EXPECT_EXIT(
      {
        setenv("DEEPINFER_KERNELS", "gpu", 1);
        exit_with_knobs_result();
      },
      ::testing::ExitedWithCode(3),
      "DEEPINFER_KERNELS='gpu' is not valid; allowed values: host, cpu");
}

TEST_F(EnvProcess, KnobsIsParsedOnceAcrossThreads) {
  EXPECT_EXIT(
      {
        setenv("DEEPINFER_THREADS", "5", 1);
        std::vector<const Knobs*> seen(8);
        std::vector<std::thread> ts;
        for (int i = 0; i < 8; ++i) ts.emplace_back([&seen, i] { seen[size_t(i)] = &knobs(); });
        for (auto& t : ts) t.join();
        setenv("DEEPINFER_THREADS", "6", 1);  // too late: already parsed
        bool same = true;
        for (const Knobs* k : seen) same = same && k == seen[0] && k->threads == 5;
        std::fprintf(stderr, same && knobs().threads == 5 ? "consistent\n" : "inconsistent\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "^consistent");
}

TEST(Env, SetKnobsReplacesTheProcessKnobs) {
  const Knobs saved = knobs();
  Knobs k = saved;
  k.threads = 7;
  k.ep_combine = CombineMode::fast;
  set_knobs(k);
  EXPECT_EQ(knobs().threads, 7);
  EXPECT_EQ(knobs().ep_combine, CombineMode::fast);
  set_knobs(saved);
  EXPECT_EQ(knobs().threads, saved.threads);
}

}  // namespace
}  // namespace deepinfer
