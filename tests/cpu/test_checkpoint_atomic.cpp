// Atomic saves (tg::save, safetensors::save_file): a failed, refused or killed save keeps the
// previous file and leaves no temporary behind; only stale temporaries of the same file are
// removed.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/checkpoint_util.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

// ---- atomic saves -----------------------------------------------------------------------

TEST(Checkpoint, FailedSaveKeepsThePreviousFile) {
  TempDir dir;
  const std::string p = dir.file("model.safetensors");
  auto a = small_cnn(1);
  save(*a, p);
  const std::string before = read_bytes(p);
  auto b = small_cnn(2);
  // Fail at the start, inside the header, at the data's first byte, in the middle of it.
  for (int64_t after : {0, 5, 100, 300, 600}) {
    st::testing::fail_next_write_after(after);
    TG_EXPECT_ERROR(save(*b, p), "simulated failure", "model.safetensors");
    EXPECT_EQ(read_bytes(p), before) << "failure after " << after << " bytes";
    EXPECT_EQ(dir.entries(), std::vector<std::string>({"model.safetensors"})) << "a temporary file was left behind";
  }
  // The next save (no fault armed) goes through and replaces the file.
  save(*b, p);
  EXPECT_NE(read_bytes(p), before);
  auto c = small_cnn(3);
  load(*c, p);
  expect_same_parameters(*b, *c);
}

TEST(Checkpoint, SaveIntoAMissingDirectoryFails) {
  TempDir dir;
  auto a = small_cnn(1);
  TG_EXPECT_ERROR(save(*a, dir.file("no/such/dir/m.safetensors")), "cannot create", "no/such/dir");
}

// Run as `nobody` when the suite runs as root (root would write anyway) rather than skipped.
TEST(Checkpoint, SaveIntoAReadOnlyDirectoryFailsAndKeepsTheFile) {
  TempDir dir;
  const Nobody nobody;
  auto a = small_cnn(1), b = small_cnn(2);
  const std::string ro = dir.file("ro"), p = dir.file("ro/m.safetensors");
  std::filesystem::create_directories(ro);
  save(*a, p);
  const std::string before = read_bytes(p);
  ASSERT_EQ(::chmod(dir.file("").c_str(), 0755), 0);  // `nobody` may enter the test directory
  ASSERT_EQ(::chmod(p.c_str(), 0666), 0);             // only the directory stops the save
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  const int rc = run_in_child([&] {
    if (!nobody.become()) return 3;
    if (::access(ro.c_str(), W_OK) == 0) return 4;  // permissions would not stop the write
    return throws_error([&] { save(*b, p); }, {"cannot create", "is the directory writable", "Permission denied"})
               ? 0
               : 1;
  });
  ::chmod(ro.c_str(), 0755);
  if (rc == 3) GTEST_SKIP() << "root here cannot become nobody (setuid refused): permissions cannot be tested";
  EXPECT_EQ(rc, 0) << "4: the directory was writable, 1: no error or another one";
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_TRUE(temporaries(dir).empty());
}

// ---- what a save replaces ----------------------------------------------------------------

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

mode_t current_umask() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

TEST(Checkpoint, SaveKeepsTheModeOfTheFileItReplaces) {
  TempDir dir;
  auto a = small_cnn(1), b = small_cnn(2);
  const std::string p = dir.file("m.safetensors");
  save(*a, p);
  EXPECT_EQ(mode_of(p), 0666 & ~current_umask()) << "a new file takes the umask's mode";
  for (mode_t mode : {0600, 0640, 0444}) {
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
    if (mode == 0444 && ::geteuid() != 0) continue;  // refused: see SaveRefusesAFileItMayNotWrite
    save(*b, p);
    EXPECT_EQ(mode_of(p), mode) << "a private or read-only checkpoint must stay so";
    auto c = small_cnn(3);
    load(*c, p);
    expect_same_parameters(*b, *c);
  }
  EXPECT_TRUE(temporaries(dir).empty());
}

// A save through a symbolic link writes the link's target (beside it, then renamed over it)
// and leaves the link a link.
TEST(Checkpoint, SaveThroughASymlinkWritesItsTarget) {
  TempDir dir;
  auto a = small_cnn(1), b = small_cnn(2);
  std::filesystem::create_directories(dir.file("store"));
  const std::string real = dir.file("store/real.safetensors"), link = dir.file("latest.safetensors");
  save(*a, real);
  ASSERT_EQ(::chmod(real.c_str(), 0600), 0);
  ASSERT_EQ(::symlink("store/real.safetensors", link.c_str()), 0);  // relative to the link's directory
  save(*b, link);
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(mode_of(real), 0600u);
  auto c = small_cnn(3);
  load(*c, real);
  expect_same_parameters(*b, *c);
  // A dangling link: the save creates its target.
  const std::string dangling = dir.file("next.safetensors");
  ASSERT_EQ(::symlink("store/new.safetensors", dangling.c_str()), 0);
  save(*a, dangling);
  EXPECT_TRUE(std::filesystem::is_symlink(dangling));
  EXPECT_TRUE(std::filesystem::is_regular_file(dir.file("store/new.safetensors")));
  EXPECT_TRUE(temporaries(dir).empty());
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"latest.safetensors", "next.safetensors", "store"}));
  // A loop of links is an IOError.
  ASSERT_EQ(::symlink("loop2", dir.file("loop1").c_str()), 0);
  ASSERT_EQ(::symlink("loop1", dir.file("loop2").c_str()), 0);
  TG_EXPECT_ERROR(save(*a, dir.file("loop1")), "symbolic links", "loop1");
}

// A file the user may not write (0444, or another user's) is refused and left alone, as a
// plain write would be, though the directory would allow replacing it. Root may write any
// file, so the refusal runs as `nobody`, in a directory `nobody` may write.
TEST(Checkpoint, SaveRefusesAFileItMayNotWrite) {
  TempDir dir;
  const Nobody nobody;
  auto a = small_cnn(1), b = small_cnn(2);
  const std::string p = dir.file("m.safetensors");
  save(*a, p);
  const std::string before = read_bytes(p);
  ASSERT_EQ(::chmod(dir.file("").c_str(), 0777), 0);
  ASSERT_EQ(::chmod(p.c_str(), 0444), 0);
  const int rc = run_in_child([&] {
    if (!nobody.become()) return 3;
    if (::access(p.c_str(), W_OK) == 0) return 4;
    return throws_error([&] { save(*b, p); }, {"m.safetensors", "not writable", "0444", "left as it is"}) ? 0 : 1;
  });
  if (rc == 3) GTEST_SKIP() << "root here cannot become nobody (setuid refused): permissions cannot be tested";
  EXPECT_EQ(rc, 0) << "4: the file was writable, 1: no error or another one";
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(mode_of(p), 0444u);
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"m.safetensors"}));
}

TEST(Checkpoint, SaveOverADirectoryFails) {
  TempDir dir;
  auto a = small_cnn(1);
  std::filesystem::create_directories(dir.file("d.safetensors"));
  TG_EXPECT_ERROR(save(*a, dir.file("d.safetensors")), "not a regular file", "d.safetensors");
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"d.safetensors"}));
}

TEST(Checkpoint, UnreadableFileFailsAndChangesNothing) {
  TempDir dir;
  const Nobody nobody;
  auto a = small_cnn(1), b = small_cnn(2);
  const std::string p = dir.file("m.safetensors");
  save(*a, p);
  ASSERT_EQ(::chmod(dir.file("").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(p.c_str(), 0000), 0);
  const Snapshot s = snapshot(*b);
  const int rc = run_in_child([&] {
    if (!nobody.become()) return 3;
    bool ok = throws_error([&] { load(*b, p); }, {"cannot open", "m.safetensors", "Permission denied"});
    // What the parent compares is its own copy: check the child's module here.
    auto params = b->parameters();
    for (size_t i = 0; i < params.size(); ++i) ok = ok && bitwise_equal(params[i], s.values[i]);
    return ok ? 0 : 1;
  });
  if (rc == 3) GTEST_SKIP() << "root here cannot become nobody (setuid refused): permissions cannot be tested";
  EXPECT_EQ(rc, 0) << "1: no error or another one, or the module changed";
}

bool tmpfile_supported(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// A real process killed (SIGKILL) in the middle of saves: with O_TMPFILE it leaves nothing;
// with named temporaries (forced, as on file systems without O_TMPFILE) it leaves one,
// which the next save of the same file removes. The previous file stays loadable throughout.
TEST(Checkpoint, KilledSaveLeavesNoTemporaryBehind) {
  for (const bool use_tmpfile : {false, true}) {
    SCOPED_TRACE(use_tmpfile ? "O_TMPFILE" : "named temporaries");
    TempDir dir;
    if (use_tmpfile && !tmpfile_supported(dir.file(""))) {
      std::cout << "[ note ] this file system has no O_TMPFILE: only named temporaries tested\n";
      continue;
    }
    const std::string p = dir.file("big.safetensors");
    const Tensor big = full({4 << 20}, 1.5);  // 16 MB: a save takes a while (write + fsync)
    st::save_file({{"w", big}}, p);
    int left = 0, clean = 0;
    for (int attempt = 0; attempt < 30 && left + clean < 4; ++attempt) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        st::testing::set_use_tmpfile(use_tmpfile);
        try {
          for (;;) st::save_file({{"w", big}}, p);
        } catch (...) {
        }
        ::_exit(1);
      }
      ASSERT_GT(pid, 0);
      // Kill it while a save is writing: once its temporary shows (named), or after a while.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      if (use_tmpfile) std::this_thread::sleep_for(std::chrono::milliseconds(30 + 7 * attempt));
      while (!use_tmpfile && temporaries(dir).empty() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      ::kill(pid, SIGKILL);
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);  // reaped: its pid is gone
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child stopped saving by itself";
      (temporaries(dir).empty() ? clean : left) += 1;
      EXPECT_EQ(st::load_file(p)[0].second.numel(), 4 << 20) << "the checkpoint was damaged";
      // The next save here removes what the dead process left.
      st::save_file({{"w", big}}, p);
      EXPECT_TRUE(temporaries(dir).empty()) << "left behind: " << ::testing::PrintToString(temporaries(dir));
    }
    if (use_tmpfile) EXPECT_GT(clean, 0) << "every kill left a named temporary despite O_TMPFILE";
    else EXPECT_GT(left, 0) << "no kill caught a save mid-write: the clean-up was not exercised";
    EXPECT_EQ(dir.entries(), std::vector<std::string>({"big.safetensors"}));
  }
}

// What the clean-up removes: temporaries of the same file whose process is gone, nothing else.
TEST(Checkpoint, SaveRemovesOnlyStaleTemporariesOfItsFile) {
  TempDir dir;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string d = std::to_string(dead), self = std::to_string(::getpid());
  const std::vector<std::string> kept = {
      "m.safetensors.tmp." + self + ".7",   // this process: maybe another thread's save
      "m.safetensors.tmp.1.0",              // pid 1 is alive
      "other.safetensors.tmp." + d + ".0",  // another file's
      "m.safetensors.tmp." + d + ".x",      // not the pattern
      "m.safetensors.tmp." + d,             // not the pattern
      "xm.safetensors.tmp." + d + ".0"};    // another file's
  for (const std::string& name : kept) write_bytes(dir.file(name), "junk");
  write_bytes(dir.file("m.safetensors.tmp." + d + ".0"), "junk");
  write_bytes(dir.file("m.safetensors.tmp." + d + ".12"), "junk");
  st::save_file({{"a", ones({1})}}, dir.file("m.safetensors"));
  std::vector<std::string> expected = kept;
  expected.push_back("m.safetensors");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(dir.entries(), expected);
}
