// The safetensors file format (https://github.com/huggingface/safetensors), read and
// written here (the JSON header through core/json.h):
//
//   bytes [0, 8)        N, the header length, a little-endian uint64
//   bytes [8, 8 + N)    a JSON object: {"__metadata__": {"key": "value", ...},
//                         "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//                       (right-padded with spaces)
//   bytes [8 + N, ...)  the data: each tensor's row-major little-endian bytes at
//                       [begin, end) relative to the start of the data
//
// Reading validates everything the format promises before a single tensor is returned:
// the header parses, every entry has a known dtype, a shape whose size matches its byte
// range, and the byte ranges tile the data section exactly (no gap, no overlap, nothing
// past the end of the file). Errors are tg::Error naming the tensor or the byte offset.
// The header is parsed in one streaming pass, in time linear in its size and memory
// proportional to its entries (an entry has at most 64 dims): duplicate keys are found by
// hashing, Header::find is a hash lookup. Only
// regular files are read: a FIFO, device or directory is refused before it is opened
// for reading (a FIFO would block the open forever). Names and metadata must be UTF-8, on
// both sides, as the format (and Python's safetensors) requires.
// Writing is atomic: a temporary file in the same directory, fsync, rename.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "half.h"
#include "tensor.h"

namespace tg::safetensors {

// A header entry as written in the file. `dtype` is the file's code ("F32", "BF16", ...);
// any dtype the format defines is accepted in a header; F32, F64, I64, BF16 and F16 become
// tensors of their dtype, except that F16 and BF16 become F32 tensors where the reader is
// asked to widen them.
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data section
  uint64_t header_offset = 0;   // file offset of the entry's JSON, for error messages
};

struct Header {
  std::vector<TensorInfo> tensors;  // in header order
  std::vector<std::pair<std::string, std::string>> metadata;
  uint64_t data_start = 0;  // file offset of the data section (8 + N)
  uint64_t file_size = 0;

  // The entry named `name`, or nullptr: a hash lookup in the index read_header builds (a
  // linear scan while there is none, e.g. in a Header built by hand). After renaming,
  // adding or removing entries of a header read from a file, call reindex().
  const TensorInfo* find(const std::string& name) const;
  void reindex();
  // The value of a metadata key, or nullptr.
  const std::string* find_metadata(const std::string& key) const;

 private:
  std::unordered_map<std::string, size_t> by_name_;  // name -> index in `tensors`
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::vector<std::pair<std::string, std::string>>;

// Reads and validates the header only (nothing of the data section is read).
Header read_header(const std::string& path);

// Reads every tensor onto the CPU, in header order. A tensor of a dtype tapegrad has no
// equivalent for (I32, U8, ...) fails naming it. F16 and BF16 entries become f16 / bf16
// tensors holding the file's bits, or with `widen_half` f32 tensors, widened exactly
// (subnormals, infinities and NaN payloads included: decode_f16 / decode_bf16) for callers
// that compute with them (tg::load into f32 parameters); the header (read_header) keeps the
// file's dtype.
NamedTensors load_file(const std::string& path, Metadata* metadata = nullptr, bool widen_half = false);

// Reads the listed tensors of a file whose header was already read (onto the CPU), under
// load_file's rules.
NamedTensors read_tensors(const std::string& path, const Header& header, const std::vector<std::string>& names,
                          bool widen_half = false);

// Writes `tensors` (any devices; F32, F64, I64, BF16 or F16, the last two bit for bit) and `metadata` atomically: the data goes
// to a temporary file next to `path`, is fsync'ed, then renamed over `path`, so a failure
// at any point leaves a previous file at `path` as it was (and no temporary behind).
// Names, metadata keys and values must be valid UTF-8.
//
// The save acts as writing the file in place would, though it replaces it: when `path` is
// a symbolic link its target is written (the temporary goes beside the target) and the
// link stays; the new file keeps the replaced file's permission bits (and, where this
// process may set them, its owner and group), a new file gets 0666 less the umask; a file
// this process may not write (faccessat W_OK: 0444 for its owner, say, though root may) or
// a directory at `path` is refused with IOError before anything is written.
//
// A process killed during a save cannot clean up. Where the file system supports it
// (Linux O_TMPFILE: ext4, xfs, btrfs, tmpfs...) the data is written to an unnamed file,
// which disappears with the process; it is named "<path>.tmp.<pid>.<n>" only once complete,
// just before the rename. Elsewhere (NFS, ...) it has that name from the start. Either way
// each save first removes the "<path>.tmp.<pid>.<n>" files of the same target whose process
// no longer exists (kill(pid, 0) says ESRCH), so at most one killed save's temporary is
// ever left, and only until the next save. Those of live processes, including other saves
// of this one, are left alone. Pids are those of this machine's pid namespace: processes
// in another container or on another host saving the same path of a shared directory must
// not rely on this (their pids may look dead from here).
//
// `floats`: f16 / bf16 store every floating tensor as an F16 / BF16 entry (encode_half:
// each value rounded once, to nearest even; a tensor already of that type is copied bit for
// bit), as PyTorch's model.half() / .bfloat16() state dicts; I64 tensors are written as they
// are.
enum class FloatFormat { as_is, f16, bf16 };
void save_file(const NamedTensors& tensors, const std::string& path, const Metadata& metadata = {},
               FloatFormat floats = FloatFormat::as_is);

// The file's dtype code of a tapegrad dtype ("F32", "F64", "I64", "BF16", "F16"), and back
// (throws for codes with no tapegrad equivalent).
const char* dtype_code(DType t);
DType dtype_from_code(const std::string& code, const std::string& tensor_name);

// Half-precision codes the reader can widen to f32 (core/safetensors_convert.cpp).
bool is_half_code(const std::string& code);  // "F16" or "BF16"
// The element conversions (core/half.h), under the names this namespace has always used.
using tg::decode_bf16;
using tg::decode_f16;
using tg::encode_bf16;
using tg::encode_f16;
using tg::encode_half;
// Decodes `n` little-endian 2-byte values of `code` ("F16" or "BF16") into `out`.
void decode_half(const std::string& code, const unsigned char* bytes, float* out, size_t n);
// A floating dtype code (F64, F32, F16, BF16): what LoadOptions::convert_dtype converts.
bool is_floating_code(const std::string& code);

namespace testing {
// Makes the next save_file fail (throw tg::Error) after writing `bytes` bytes of its
// temporary file, as a full disk or a crash would; -1 (the default) disables. One-shot.
void fail_next_write_after(int64_t bytes);
// Whether saves may use O_TMPFILE (the default, true); false forces the named temporary, so
// that tests can exercise the clean-up of leftovers on file systems that support O_TMPFILE.
void set_use_tmpfile(bool on);
}  // namespace testing

}  // namespace tg::safetensors
