// launch_local_workers: fork/exec N workers and watch them (issue 6).

#include "crucible/distributed/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cerrno>
#include <map>
#include <system_error>
#include <thread>

namespace crucible {

namespace {

constexpr int kExitLauncherGone = 2;  // the launcher died before the worker started

std::atomic<int> g_forward_signal{0};
extern "C" void crucible_launcher_signal(int sig) { g_forward_signal.store(sig); }

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended (status " + std::to_string(status) + ")";
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::system_error(e, std::generic_category(), "bind/getsockname on 127.0.0.1");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

int launch_local_workers(const std::string& executable, const std::vector<std::string>& args,
                         const LaunchOptions& options, std::ostream& err) {
  const int port = free_local_port();
  std::map<pid_t, int> rank_of;
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = crucible_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  auto kill_all = [&](int sig) {
    for (const auto& [pid, rank] : rank_of) ::kill(pid, sig);
  };
  const pid_t launcher = ::getpid();
  // Workers write one byte here once they joined the process group: a worker
  // that dies before every worker did stops the start-up at once (no state
  // to save yet) instead of after the others' timeouts (issue 15).
  int ready_pipe[2] = {-1, -1};
  if (::pipe2(ready_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe for worker start-up");
  }
  for (int r = 0; r < options.nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int e = errno;
      kill_all(SIGKILL);
      throw std::system_error(e, std::generic_category(), "fork worker " + std::to_string(r));
    }
    if (pid == 0) {
      // Die with the launcher (issue 15): a kill -9 of it must not leave
      // workers training on, reparented to init. The parent check closes the
      // window in which the launcher died before prctl.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(kExitLauncherGone);
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      ::fcntl(ready_pipe[1], F_SETFD, 0);  // inherited across exec
      ::fcntl(ready_pipe[1], F_SETFL, 0);
      ::setenv(kLauncherReadyFdEnv, std::to_string(ready_pipe[1]).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(executable.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(executable.c_str(), argv.data());
      ::_exit(127);
    }
    rank_of[pid] = r;
  }

  ::close(ready_pipe[1]);
  int ready = 0;
  auto read_ready = [&] {
    char buf[64];
    ssize_t n;
    while ((n = ::read(ready_pipe[0], buf, sizeof buf)) > 0) ready += static_cast<int>(n);
  };
  int result = 0;
  bool failed = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!rank_of.empty()) {
    if (const int sig = g_forward_signal.exchange(0)) kill_all(sig);
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      auto it = rank_of.find(pid);
      if (it == rank_of.end()) continue;
      const int rank = it->second;
      rank_of.erase(it);
      // A worker stopped by SIGINT / SIGTERM (checkpoint written) exits
      // 130 / 143: not a failure; the launcher passes the code on.
      const bool signal_stop = WIFEXITED(status) && (WEXITSTATUS(status) == 128 + SIGINT ||
                                                     WEXITSTATUS(status) == 128 + SIGTERM);
      if (signal_stop) {
        if (!failed) result = WEXITSTATUS(status);
        continue;
      }
      read_ready();
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !failed && ready < options.nproc) {
        failed = true;
        result = exit_code(status);
        err << "crucible: error: worker rank " << rank << " " << describe(status)
            << " during start-up (before every worker joined the process group); stopping the "
               "other workers\n";
        err.flush();
        kill_all(SIGKILL);
        continue;
      }
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !failed) {
        failed = true;
        result = exit_code(status);
        err << "crucible: error: worker rank " << rank << " " << describe(status);
        if (!rank_of.empty()) {
          err << "; waiting up to "
              << std::chrono::duration_cast<std::chrono::seconds>(options.grace).count()
              << " s for the other workers to stop";
        }
        err << "\n";
        err.flush();
        deadline = std::chrono::steady_clock::now() + options.grace;
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (failed && std::chrono::steady_clock::now() > deadline) {
      for (const auto& [p, rank] : rank_of) {
        err << "crucible: error: worker rank " << rank << " did not stop in time; killed\n";
      }
      kill_all(SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::close(ready_pipe[0]);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace crucible

namespace crucible {

void signal_launcher_ready() {
  const char* fd_text = std::getenv(kLauncherReadyFdEnv);
  if (!fd_text) return;
  const int fd = std::atoi(fd_text);
  ::unsetenv(kLauncherReadyFdEnv);
  if (fd < 0) return;
  const char byte = 'r';
  (void)!::write(fd, &byte, 1);
  ::close(fd);
}

}  // namespace crucible
