#pragma once
// Crash-safe storage of numbered checkpoints: named byte blobs with a
// manifest, SHA-256 checksums and retention. Knows nothing about models.
//
// On-disk layout of a store directory DIR:
//
//   DIR/manifest.json            the only source of truth (format below)
//   DIR/ckpt-000007/             files of checkpoint 7 (index padded to 6)
//   DIR/ckpt-000007/model.pt
//   DIR/ckpt-000007/optim/0.pt   (at most one subfolder level)
//   DIR/ckpt-000003.r2/          checkpoint 3 after it was overwritten twice
//   DIR/.lock                    flock(2) taken by writers
//   DIR/.tmp-*, DIR/.manifest.json.tmp-*   leftovers of an interrupted save
//
// manifest.json (schema_version 1; unknown keys are rejected):
//
//   {"schema_version": 1,
//    "checkpoints": [                          // sorted by index
//      {"index": 7, "dir": "ckpt-000007",
//       "step_count": 1200, "epoch_count": 3,
//       "counters": {"batch_count": 1300},      // extra int64 counters
//       "time": "2024-05-01T12:00:00Z",         // ISO-8601 UTC
//       "metric": {"name": "val_loss", "value": 0.25},   // optional
//       "files": [{"name": "model.pt", "size": 1234,
//                  "sha256": "<64 lowercase hex>"}]}]}
//
// A non-finite metric value is stored as the string "NaN", "Infinity" or
// "-Infinity".
//
// Crash safety (versioned folders): save() writes every file of the new
// checkpoint into a fresh folder DIR/.tmp-<dir>-<pid>-<random>/ (each file as
// a dot-prefixed temporary name, fsync'd, renamed, its folder fsync'd), then
// renames that folder to its final name and fsyncs DIR. A new slot is named
// ckpt-<index:06>; overwriting a slot whose manifest folder is ckpt-000003
// (revision 0) or ckpt-000003.r<k> writes revision k+1, ckpt-000003.r<k+1>,
// so the old folder is untouched. Only then is manifest.json rewritten
// (temporary name, fsync, rename, fsync DIR). Until that rename the old
// manifest names only old, complete folders; after it, only complete ones.
// Folders no longer named by the manifest and temporaries are removed after
// the rename and at the start of the next save (best effort). Readers only
// follow the manifest, so leftovers are never read.
//
// Safety of reading: every name in the manifest is validated (see
// is_valid_file_name; a folder must be ckpt-<index:06>[.r<k>] of its own
// index) and every path is resolved with std::filesystem::canonical and must
// lie inside canonical(DIR) before it is opened (O_NOFOLLOW, O_NONBLOCK, a
// regular file only). A file's size from the manifest is compared with the
// real size (fstat) before any buffer is allocated. Nothing outside DIR is
// ever opened.
//
// One writer at a time: save/prune/collect_garbage take an exclusive
// flock(2) on DIR/.lock and throw std::runtime_error when another store
// (this or another process) holds it. Readers take no lock. A CheckpointStore
// object is not safe for concurrent use from several threads.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace crucible::checkpoint {

/// Counters recorded with a checkpoint. `extra` holds any further named
/// int64 counters (e.g. "batch_count", "epoch_step_count"); names must be
/// non-empty.
struct CheckpointCounters {
  std::int64_t step_count = 0;
  std::int64_t epoch_count = 0;
  std::map<std::string, std::int64_t> extra;
};

/// A named metric value (e.g. a validation loss) used by retention.
struct CheckpointMetric {
  std::string name;
  double value = 0.0;
};

/// One file to write into a checkpoint: `write` streams the file's bytes to
/// the given std::ostream (e.g. torch::save(tensor, os)). An exception from
/// `write`, or a stream left in a failed state, aborts the save with the
/// previous checkpoints untouched.
struct CheckpointFile {
  std::string name;                          ///< see is_valid_file_name
  std::function<void(std::ostream&)> write;  ///< writes the whole file

  /// A file whose content is `data` (copied once, shared by copies).
  static CheckpointFile from_bytes(std::string name, std::string data);
};

/// A file as the manifest records it.
struct CheckpointFileInfo {
  std::string name;        ///< relative to the checkpoint's folder
  std::uint64_t size = 0;  ///< bytes
  std::string sha256;      ///< 64 lowercase hex characters
};

/// One checkpoint as the manifest records it.
struct CheckpointEntry {
  std::int64_t index = 0;
  std::string dir;   ///< folder name inside the store, ckpt-<index:06>[.r<k>]
  CheckpointCounters counters;
  std::string time;  ///< ISO-8601 UTC, "YYYY-MM-DDTHH:MM:SSZ"
  std::optional<CheckpointMetric> metric;
  std::vector<CheckpointFileInfo> files;
};

/// Which checkpoints survive a save. keep_last == 0 keeps every checkpoint.
/// Otherwise the kept set is: the keep_last highest indices, plus the
/// keep_best checkpoints whose metric is named keep_best_by (when non-empty)
/// with the lowest (mode min) or highest (mode max) value (NaN never counts
/// as best; ties keep the higher index), plus the checkpoint just saved.
struct RetentionPolicy {
  enum class Mode { min, max };
  std::size_t keep_last = 0;
  std::string keep_best_by;
  Mode mode = Mode::min;
  std::size_t keep_best = 1;
};

/// Loaded, verified files of one checkpoint: name -> bytes.
using CheckpointFiles = std::map<std::string, std::string>;

/// A newer checkpoint that failed verification and why.
struct CheckpointFailure {
  std::int64_t index = 0;
  std::string message;  ///< the DataError's message (names the file)
};

/// Result of CheckpointStore::newest_intact.
struct IntactCheckpoint {
  /// The highest-index checkpoint whose files all verify; empty when none.
  std::optional<CheckpointEntry> entry;
  /// Checkpoints newer than `entry` (all of them when `entry` is empty) that
  /// failed, newest first.
  std::vector<CheckpointFailure> failed;
};

/// Names that may appear in a manifest's "files": one or two components
/// separated by a single '/', each 1..255 characters from [A-Za-z0-9._+=@-],
/// not starting with '.' (dot names are reserved for temporaries; this also
/// rules out "." and ".."). So "model.pt" and "optim/0.pt" are valid; "",
/// "/abs", "a/b/c", "../x", "a//b", "a\\b" are not.
bool is_valid_file_name(const std::string& name);

/// Test hook called by save() at named points (see CheckpointStore::save).
/// An exception thrown by the hook propagates WITHOUT the cleanup that other
/// errors get, leaving the directory exactly as a crash at that point would.
using SaveFaultHook = std::function<void(const std::string& phase)>;

/// A checkpoint directory (see the file comment for format and guarantees).
class CheckpointStore {
 public:
  /// Opens the store at `dir`. Nothing is read or created until used; the
  /// directory is created by the first save.
  explicit CheckpointStore(std::filesystem::path dir, RetentionPolicy retention = {});

  /// The directory given to the constructor.
  const std::filesystem::path& dir() const { return dir_; }
  /// The retention policy applied by save() and prune().
  const RetentionPolicy& retention() const { return retention_; }
  /// Replaces the retention policy (takes effect at the next save/prune).
  void set_retention(RetentionPolicy retention) { retention_ = std::move(retention); }

  /// Writes a checkpoint and returns its manifest entry. index == -1 appends
  /// (highest index in the manifest + 1, 0 for an empty store); index >= 0
  /// writes that slot, replacing an existing checkpoint there only once the
  /// new manifest is in place. Retention is applied in the same manifest
  /// update; removed folders and leftovers are then deleted (best effort).
  /// Throws std::invalid_argument for index < -1, an invalid or duplicate
  /// file name, a file name that is also another file's folder, an empty
  /// metric or counter name, or a file without a writer; DataError when the
  /// existing manifest is unreadable (it is never overwritten then);
  /// std::runtime_error when the store is locked by another writer;
  /// std::system_error on I/O errors; whatever a writer throws. On any of
  /// these the previous manifest and its checkpoints are intact.
  /// `fault_hook` (tests) is called with "file_written:<name>" after each
  /// file, "folder_renamed" once the folder has its final name,
  /// "manifest_written" before the manifest rename and "manifest_renamed"
  /// right after it (before garbage collection).
  CheckpointEntry save(std::int64_t index, const CheckpointCounters& counters,
                       const std::vector<CheckpointFile>& files,
                       std::optional<CheckpointMetric> metric = std::nullopt,
                       const SaveFaultHook& fault_hook = {});

  /// Applies the retention policy to the existing checkpoints (a manifest
  /// rewrite when something is removed, then garbage collection). Returns
  /// the removed indices. Throws like save().
  std::vector<std::int64_t> prune();

  /// Removes leftovers of interrupted saves (.tmp-* entries, manifest
  /// temporaries) and ckpt-* folders the manifest does not name; never
  /// touches other files. Best effort: errors are ignored, except a corrupt
  /// manifest (DataError) or a held lock (std::runtime_error), in which case
  /// nothing is removed.
  void collect_garbage();

  /// The manifest's checkpoints sorted by index; empty when there is no
  /// manifest.json yet. Throws DataError naming manifest.json (with the line
  /// for JSON syntax errors, the field path otherwise) when it is corrupt,
  /// truncated, of another schema_version, names an unsafe file or folder,
  /// or is not a regular file inside the directory.
  std::vector<CheckpointEntry> list() const;

  /// The manifest entry of `index`, or nullopt. Throws like list().
  std::optional<CheckpointEntry> find(std::int64_t index) const;

  /// Reads and verifies every file of checkpoint `index`. Throws DataError
  /// when the index is not in the manifest, or naming the file's path when
  /// it is missing, outside the directory (symlink), not a regular file, or
  /// its size or SHA-256 differs from the manifest ("... must be <expected>,
  /// got <actual>"); plus list()'s errors.
  CheckpointFiles load(std::int64_t index) const;

  /// Reads and verifies one file of checkpoint `index`; errors as load(),
  /// plus DataError when the checkpoint has no file `name`.
  std::string load_file(std::int64_t index, const std::string& name) const;

  /// Verifies every file of checkpoint `index` (streaming, nothing kept).
  /// Throws exactly what load() throws.
  void verify(std::int64_t index) const;

  /// The highest-index checkpoint that verifies, and the newer ones that
  /// failed with their messages, so a caller can say "checkpoint 7 is
  /// corrupted (...); resuming from 6". Throws list()'s errors.
  IntactCheckpoint newest_intact() const;

  /// Path of the manifest: dir()/manifest.json.
  std::filesystem::path manifest_path() const { return dir_ / "manifest.json"; }

 private:
  std::filesystem::path dir_;
  RetentionPolicy retention_;
};

}  // namespace crucible::checkpoint
