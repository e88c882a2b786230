// Helpers of the checkpoint test programs (test_json, test_safetensors, test_checkpoint_atomic,
// test_checkpoint): raw file bytes, hand-made safetensors files, parameter snapshots, a small
// training loop, and child processes (kills, blocking opens, dropped privileges).
#pragma once
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "common/fixtures.h"
#include "common/test_util.h"

namespace tg::test {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file laid out by hand: 8-byte little-endian length, header, data.
inline std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

inline std::string float_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

struct Snapshot {
  std::vector<Tensor> values;
  std::vector<uint64_t> versions;
};
inline Snapshot snapshot(const nn::Module& m) {
  Snapshot s;
  for (const Tensor& p : m.parameters()) {
    s.values.push_back(p.clone());
    s.versions.push_back(p.version());
  }
  return s;
}
// Nothing was written: same values and no in-place write at all (versions unchanged).
inline void expect_unchanged(const nn::Module& m, const Snapshot& s) {
  auto params = m.parameters();
  ASSERT_EQ(params.size(), s.values.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(params[i], s.values[i])) << "parameter " << i << " changed";
    EXPECT_EQ(params[i].version(), s.versions[i]) << "parameter " << i << " was written";
  }
}

inline void expect_same_parameters(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(bitwise_equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

struct Batch {
  Tensor x, y;
};
inline Batch make_batch(uint64_t seed) {
  manual_seed(seed);
  Tensor x = randn({4, 3, 7, 9});
  Tensor y = from_vector(std::vector<int64_t>{0, 3, 4, 1}, {4});
  return {x, y};
}

inline std::vector<double> train(nn::Module& model, nn::Optimizer& opt, const Batch& b, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Tape tape;
    Tensor loss = cross_entropy(model(b.x), b.y);
    losses.push_back(loss.item());
    tape.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  return losses;
}

// ---- child processes: kills, blocking opens, dropped privileges ---------------------------

constexpr int kChildTimedOut = -1000;

// Runs `body` in a forked child and returns its exit status (-signal if killed, or
// kChildTimedOut when it ran past `timeout_s` and was killed). The child never returns into
// the test framework; gtest assertions there would be lost, so bodies return codes.
inline int run_in_child(const std::function<int()>& body, double timeout_s = 30) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 98;
    try {
      rc = body();
    } catch (...) {
      rc = 99;
    }
    ::_exit(rc);
  }
  if (pid < 0) return -2000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return kChildTimedOut;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// Whether `f` throws tg::Error with every fragment in its message (for child bodies).
inline bool throws_error(const std::function<void()>& f, std::initializer_list<const char*> fragments) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* frag : fragments)
      if (msg.find(frag) == std::string::npos) return false;
    return true;
  }
  return false;
}

// Root ignores file permissions: tests of permission failures run their body as `nobody`
// in a child (a no-op for other users), so that they test the failure rather than skip.
struct Nobody {
  uid_t uid = 65534;
  gid_t gid = 65534;
  Nobody() {  // looked up before any fork
    if (const passwd* pw = ::getpwnam("nobody")) uid = pw->pw_uid, gid = pw->pw_gid;
  }
  bool become() const {
    if (::geteuid() != 0) return true;
    ::setgroups(0, nullptr);  // may be denied in a user namespace; the uid is what matters
    return ::setgid(gid) == 0 && ::setuid(uid) == 0 && ::geteuid() == uid;
  }
};

inline std::vector<std::string> temporaries(const TempDir& dir) {
  std::vector<std::string> out;
  for (const std::string& e : dir.entries())
    if (e.find(".tmp.") != std::string::npos) out.push_back(e);
  return out;
}

}  // namespace tg::test
