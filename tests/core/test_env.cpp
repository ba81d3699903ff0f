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
  EXPECT_EQ(k.comm, "local");
  EXPECT_EQ(k.comm_timeout_s, 60.0);
  EXPECT_EQ(k.ep_algo, "auto");
  EXPECT_EQ(k.ep_ag_rows, "max");
  EXPECT_EQ(k.ep_reduce, "rs");
  EXPECT_EQ(k.ep_chunk_bytes, size_t(64) << 20);
  EXPECT_EQ(k.ep_combine, "exact");
  EXPECT_EQ(k.kernels, "cpu");
  EXPECT_EQ(k.threads, 0);
  EXPECT_TRUE(k.decode_layout);
  EXPECT_FALSE(parse({{"DEEPINFER_DECODE_LAYOUT", "off"}}).decode_layout);
  EXPECT_TRUE(parse({{"DEEPINFER_DECODE_LAYOUT", "on"}}).decode_layout);
  EXPECT_TRUE(k.batch_invariant);
  EXPECT_FALSE(parse({{"DEEPINFER_BATCH_INVARIANT", "off"}}).batch_invariant);
  EXPECT_TRUE(k.amx);
  EXPECT_FALSE(parse({{"DEEPINFER_AMX", "off"}}).amx);
  EXPECT_THROW(parse({{"DEEPINFER_AMX", "yes"}}), Error);
  EXPECT_EQ(k.ep_peer_memory, "auto");
  EXPECT_EQ(k.fault, "");
  EXPECT_EQ(k.capabilities_file, "");
  EXPECT_EQ(k.log_level, "info");
  // Empty values mean "unset".
  const Knobs e = parse({{"DEEPINFER_EP_ALGO", ""}, {"DEEPINFER_THREADS", ""}});
  EXPECT_EQ(e.ep_algo, "auto");
  EXPECT_EQ(e.threads, 0);
}

// The defaults in the table (--help-env) are the ones the parser gives.
TEST(Env, DocumentedDefaultsAreTheParsersDefaults) {
  const Knobs k = parse({});
  const std::map<std::string, std::string> got = {
      {"DEEPINFER_COMM", k.comm},
      {"DEEPINFER_EP_ALGO", k.ep_algo},
      {"DEEPINFER_EP_AG_ROWS", k.ep_ag_rows},
      {"DEEPINFER_EP_REDUCE", k.ep_reduce},
      {"DEEPINFER_EP_COMBINE", k.ep_combine},
      {"DEEPINFER_EP_PEER_MEMORY", k.ep_peer_memory},
      {"DEEPINFER_EP_SPLIT", k.ep_split ? "on" : "off"},
      {"DEEPINFER_KERNELS", k.kernels},
      {"DEEPINFER_LOG", k.log_level},
      {"DEEPINFER_DECODE_LAYOUT", k.decode_layout ? "on" : "off"},
      {"DEEPINFER_BATCH_INVARIANT", k.batch_invariant ? "on" : "off"},
      {"DEEPINFER_AMX", k.amx ? "on" : "off"},
      {"DEEPINFER_PIN_RANKS", k.pin_ranks ? "on" : "off"},
      {"DEEPINFER_LOAD", k.load}};
  for (const KnobDoc& d : knob_docs()) {
    if (!got.count(d.name)) continue;
    EXPECT_EQ(got.at(d.name), d.def) << d.name;
  }
}

// Every word a knob with a fixed set of values allows is accepted and kept as given.
TEST(Env, EnumKnobsAcceptEveryAllowedValue) {
  const std::map<std::string, std::vector<std::string_view>> expected = {
      {"DEEPINFER_COMM", {"local", "mpi"}},
      {"DEEPINFER_EP_ALGO", {"ag", "a2a", "auto"}},
      {"DEEPINFER_EP_AG_ROWS", {"max", "cap"}},
      {"DEEPINFER_EP_REDUCE", {"rs", "ar"}},
      {"DEEPINFER_EP_COMBINE", {"exact", "fast"}},
      {"DEEPINFER_EP_PEER_MEMORY", {"auto", "on", "off"}},
      {"DEEPINFER_EP_SPLIT", {"on", "off"}},
      {"DEEPINFER_KERNELS", {"host", "cpu"}},
      {"DEEPINFER_DECODE_LAYOUT", {"on", "off"}},
      {"DEEPINFER_BATCH_INVARIANT", {"on", "off"}},
      {"DEEPINFER_AMX", {"on", "off"}},
      {"DEEPINFER_PIN_RANKS", {"on", "off"}},
      {"DEEPINFER_LOAD", {"mmap", "bucket", "auto"}},
      {"DEEPINFER_LOG", {"debug", "info", "warn", "error"}},
  };
  for (const KnobDoc& d : knob_docs()) {
    const auto it = expected.find(d.name);
    EXPECT_EQ(knob_choices(d.name),
              it == expected.end() ? std::vector<std::string_view>{} : it->second)
        << d.name;
  }
  EXPECT_EQ(parse({{"DEEPINFER_COMM", "mpi"}}).comm, "mpi");
  EXPECT_EQ(parse({{"DEEPINFER_EP_ALGO", "ag"}}).ep_algo, "ag");
  EXPECT_EQ(parse({{"DEEPINFER_EP_ALGO", "a2a"}}).ep_algo, "a2a");
  EXPECT_EQ(parse({{"DEEPINFER_EP_AG_ROWS", "cap"}}).ep_ag_rows, "cap");
  EXPECT_EQ(parse({{"DEEPINFER_EP_REDUCE", "ar"}}).ep_reduce, "ar");
  EXPECT_EQ(parse({{"DEEPINFER_EP_COMBINE", "fast"}}).ep_combine, "fast");
  EXPECT_EQ(parse({{"DEEPINFER_EP_PEER_MEMORY", "off"}}).ep_peer_memory, "off");
  EXPECT_EQ(parse({{"DEEPINFER_EP_PEER_MEMORY", "on"}}).ep_peer_memory, "on");
  EXPECT_FALSE(parse({{"DEEPINFER_EP_SPLIT", "off"}}).ep_split);
  EXPECT_EQ(parse({{"DEEPINFER_KERNELS", "host"}}).kernels, "host");
  EXPECT_EQ(parse({{"DEEPINFER_LOAD", "bucket"}}).load, "bucket");
  for (const char* level : {"debug", "info", "warn", "error"})
    EXPECT_EQ(parse({{"DEEPINFER_LOG", level}}).log_level, level);
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
  EXPECT_EQ(k.fault, "kernel:moe:3");  // the op name is the kernels layer's to check
  EXPECT_EQ(k.capabilities_file, "/tmp/caps file.json");
}

TEST(Env, FaultKnobHasTheKernelForm) {
  const FaultKnob f = parse_fault_knob("kernel:gemm_fp8_grouped_masked:12");
  EXPECT_EQ(f.op, "gemm_fp8_grouped_masked");
  EXPECT_EQ(f.call, 12u);
  EXPECT_EQ(parse({{"DEEPINFER_FAULT", "kernel:rms_norm:0"}}).fault, "kernel:rms_norm:0");
  for (const std::string bad :
       {"garbage", "kernel", "kernel:", "kernel:rms_norm", "kernel:rms_norm:", "kernel::3",
        "kernel:rms_norm:-1", "kernel:rms_norm:x", "kernel:rms_norm:1.5", "comm:drop:3",
        "a2av-hang", "KERNEL:rms_norm:3", "kernel:rms_norm:99999999999999999999"}) {
    const std::string msg = parse_error({{"DEEPINFER_FAULT", bad}});
    EXPECT_EQ(msg.rfind("DEEPINFER_FAULT='" + bad + "' is not valid", 0), 0u) << msg;
    EXPECT_NE(msg.find("kernel:<op>:<call>"), std::string::npos) << msg;
  }
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
      {"DEEPINFER_EP_SPLIT", {"on, off", {"ON", "1", "balanced"}}},
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
  EXPECT_EQ(documented.size(), 19u);
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
    std::fprintf(stderr, "threads=%d algo=%s\n", k.threads, k.ep_algo.c_str());
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

TEST_F(EnvProcess, KnobsRejectsAFaultNotOfTheKernelForm) {
  EXPECT_EXIT(
      {
        setenv("DEEPINFER_FAULT", "garbage", 1);
        exit_with_knobs_result();
      },
      ::testing::ExitedWithCode(3), "DEEPINFER_FAULT='garbage' is not valid .*kernel:<op>:<call>");
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
  k.ep_combine = "fast";
  set_knobs(k);
  EXPECT_EQ(knobs().threads, 7);
  EXPECT_EQ(knobs().ep_combine, "fast");
  set_knobs(saved);
  EXPECT_EQ(knobs().threads, saved.threads);
}

}  // namespace
}  // namespace deepinfer
