// The turn protocol (step_turns.h): one pipe each way. The holder of the turn runs its slots; when
// the ABBA order gives the next slot to the peer it writes that slot's number, and the peer, which
// blocks reading, takes over. -1 says "no more slots here". Every read has a deadline, and a peer
// that exits closes its pipe, so a dead or stuck peer is an error, never a hang.
#include "step_turns.h"

#include <deepinfer/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

extern char** environ;

namespace deepinfer::cli {
namespace {
// A turn is one engine step, or a warm-up prefill: ten minutes without one is a hang.
constexpr int kTurnTimeoutMs = 10 * 60 * 1000;
constexpr int64_t kDone = -1;

int parse_fd(const std::string& s) {
  size_t used = 0;
  int fd = -1;
  try {
    fd = std::stoi(s, &used);
  } catch (const std::exception&) {
  }
  if (used != s.size() || fd < 0)
    throw Error(
        fmt::format("--ab-peer: '{}' is not a file descriptor (bench decode --ab sets it)", s));
  return fd;
}
}  // namespace

StepTurns StepTurns::spawn(std::vector<std::string> argv, const std::vector<std::string>& env) {
  int to_peer[2], from_peer[2];
  if (pipe(to_peer) != 0 || pipe(from_peer) != 0)
    throw Error(fmt::format("bench decode --ab: pipe: {}", std::strerror(errno)));
  // This side's ends stay out of the peer (and of anything else this process starts).
  fcntl(to_peer[1], F_SETFD, FD_CLOEXEC);
  fcntl(from_peer[0], F_SETFD, FD_CLOEXEC);
  argv.push_back("--ab-peer");
  argv.push_back(fmt::format("{},{}", to_peer[0], from_peer[1]));
  // The environment plus `env`, each NAME=VALUE replacing NAME's entry.
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string s(*e);
    bool replaced = false;
    for (const std::string& x : env)
      replaced |= s.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
    if (!replaced) envs.push_back(s);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> args, envp;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  for (std::string& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // Only A prints results; the peer's errors still reach stderr.
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(to_peer[0]);
  close(from_peer[1]);
  if (rc != 0) {
    close(to_peer[1]);
    close(from_peer[0]);
    throw Error(fmt::format("bench decode --ab: cannot start {}: {}", argv[0], std::strerror(rc)));
  }
  // A peer that dies makes writes fail with EPIPE (an error below), not kill this process.
  signal(SIGPIPE, SIG_IGN);
  return StepTurns(0, from_peer[0], to_peer[1], pid, argv[0]);
}

StepTurns StepTurns::attach(const std::string& fds) {
  const size_t comma = fds.find(',');
  if (comma == std::string::npos)
    throw Error(fmt::format("--ab-peer: expected R,W file descriptors, got '{}'", fds));
  return StepTurns(1, parse_fd(fds.substr(0, comma)), parse_fd(fds.substr(comma + 1)), -1,
                   "the bench decode --ab process that started this one");
}

StepTurns::StepTurns(StepTurns&& o) noexcept
    : me_(o.me_),
      in_(std::exchange(o.in_, -1)),
      out_(std::exchange(o.out_, -1)),
      pid_(std::exchange(o.pid_, -1)),
      peer_(std::move(o.peer_)),
      slot_(o.slot_),
      peer_done_(o.peer_done_),
      finished_(o.finished_) {}

StepTurns::~StepTurns() {
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
  if (pid_ > 0) {  // A leaving early (an error): the peer must not outlive it
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
}

void StepTurns::write_all(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(out_, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw Error(fmt::format("bench decode --ab: {} is gone ({}); see its error above", peer_,
                              std::strerror(errno)));
    c += w;
    n -= size_t(w);
  }
}

void StepTurns::read_all(void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{in_, POLLIN, 0};
    const int ready = poll(&pf, 1, kTurnTimeoutMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0)
      throw Error(fmt::format("bench decode --ab: {} sent nothing for 10 minutes", peer_));
    const ssize_t r = read(in_, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(fmt::format(
          "bench decode --ab: {} exited before it finished; see its error above", peer_));
    c += r;
    n -= size_t(r);
  }
}

void StepTurns::acquire() {
  while (!holding()) {
    int64_t m = 0;
    read_all(&m, sizeof m);
    if (m == kDone)
      peer_done_ = true;
    else
      slot_ = m;
  }
}

void StepTurns::release(const std::function<void()>& before_handover) {
  ++slot_;
  if (holding()) return;
  if (before_handover) before_handover();
  write_all(&slot_, sizeof slot_);
}

void StepTurns::finish() {
  finished_ = true;
  if (peer_done_) return;
  acquire();  // the peer hands the turn back, or says it is done too
  if (peer_done_) return;
  write_all(&kDone, sizeof kDone);
}

void StepTurns::wait_peer() {
  int status = 0;
  const pid_t pid = std::exchange(pid_, -1);
  if (waitpid(pid, &status, 0) != pid)
    throw Error(fmt::format("bench decode --ab: waiting for {}: {}", peer_, std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(fmt::format("bench decode --ab: {} failed (exit status {}); see its error above",
                            peer_,
                            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)));
}

}  // namespace deepinfer::cli
