// The persistent store: a directory of immutable generations, each a manifest
// plus HDF5 shard files, and a root manifest naming the current one.
// docs/store_format.md describes the layout and the commit protocol.
//
//   STORE/manifest.json                     {"format":"ptcfs-store","version":1,"generation":7}
//   STORE/gen-000007/manifest.json          the GenerationManifest (manifest.h)
//   STORE/gen-000007/worker-00/<name>.s0.h5 one stored shard per HDF5 file
//
// A generation becomes current only when the root manifest.json is renamed
// into place (generation_writer.h); a failure at any earlier point leaves the
// previous generation current and its files untouched. shard_verify.h reads
// and checks shard bytes.
//
// The Env carries every byte ptcfs itself writes (manifests, tensor bytes,
// directories), but HDF5 creates the shard files' metadata through the OS
// (h5shard.h): a Store needs an Env backed by the real filesystem (Env::Default
// or a wrapper of it such as FaultInjectionEnv), not NewMemEnv.
//
// One writer per store (store_lock.h): BeginGeneration and CollectGarbage
// run only while this process holds the store's StoreLock, and take it
// themselves (without waiting, for that one write) when it does not, then re-read the root
// manifest: a Store whose current generation is no longer the committed one
// cannot write. A writer opens with OpenForWrite, which takes the lock before
// it reads the root manifest, so that it builds on the manifest as it is
// under the lock. Readers use Open and take no lock.
//
// Thread safety: Store's const methods may be called from any thread. At most
// one GenerationWriter exists at a time; it must not outlive its Store.
// current() returns a reference that a Commit replaces: readers that run
// concurrently with a writer use CurrentSnapshot().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "ptc/base/env.h"
#include "ptc/base/mutex.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store_layout.h"
#include "ptc/store/store_lock.h"

namespace ptc {

class GenerationWriter;

// An empty file in gen-NNNNNN/ from BeginGeneration until the commit point: a
// directory above the current generation that holds it was never committed,
// even if a manifest.json was written before the commit failed.
inline constexpr char kUncommittedMarker[] = ".uncommitted";

class Store {
 public:
  // Creates a store at `root`, which must not exist or be an empty directory
  // (or hold only the writer's lock file); writes manifest.json with generation 0.
  // \error AlreadyExists when `root` is a file or a non-empty directory.
  // \error IOError (or an injected error) when writing fails.
  static Result<std::unique_ptr<Store>> Create(Env* env, std::string root);

  // Opens the store at `root` and loads its current generation manifest.
  // \error NotFound when ROOT/manifest.json does not exist ("ROOT/manifest.json: ...").
  // \error Corruption when it is not a store manifest, or the generation it names is
  //        missing or its manifest is invalid (message names the file).
  static Result<std::unique_ptr<Store>> Open(Env* env, std::string root);

  // Takes the store's writer lock (StoreLock::Acquire(root, lock)), then opens
  // it as Open does; the Store keeps the lock until it is destroyed. When
  // lock.create_dir is set and ROOT/manifest.json does not exist, creates the
  // store as Create does (under the lock).
  // \error FailedPrecondition when another process holds the lock (names the holder).
  // \error as StoreLock::Acquire, Open and Create.
  static Result<std::unique_ptr<Store>> OpenForWrite(Env* env, std::string root, const StoreLockOptions& lock);
  // As OpenForWrite, with the lock already taken (REQUIRES: `lock` is ROOT's, held).
  // With create: creates the store when ROOT/manifest.json does not exist.
  static Result<std::unique_ptr<Store>> OpenLocked(Env* env, std::string root, StoreLock lock, bool create = false);

  ~Store();

  const std::string& root() const { return root_; }
  Env* env() const { return env_; }
  bool has_generation() const;
  // The current generation number; 0 when there is none.
  uint64_t current_generation() const;
  // REQUIRES: has_generation(). Valid until the next Commit through this Store.
  const GenerationManifest& current() const;
  // The current manifest, kept alive for as long as the caller holds it; null when none.
  std::shared_ptr<const GenerationManifest> CurrentSnapshot() const;

  // Reads and validates gen-NNNNNN/manifest.json.
  // \error NotFound when that generation does not exist.
  // \error Corruption when its manifest is invalid or names another generation.
  Result<GenerationManifest> LoadGeneration(uint64_t g) const;

  // ROOT/rel.
  std::string AbsPath(const std::string& rel) const;

  // Starts a new generation numbered above the current one and above every
  // gen-NNNNNN directory there is (numbers never go back, even when the root
  // manifest was set back by hand). Under the lock it first removes leftovers
  // of writers that died: directories above the current generation with no
  // manifest.json or with the kUncommittedMarker, and what is left of
  // generations this Store began and did not commit. Other directories that
  // hold a manifest.json (committed once) are never touched.
  // \error FailedPrecondition when another GenerationWriter is active, when
  //        another process holds the writer lock, or when the root manifest no
  //        longer names this Store's current generation (another writer committed).
  // \error IOError (or injected) when the directory cannot be prepared.
  // \error IOError (or injected) when the directory cannot be prepared.
  Result<std::unique_ptr<GenerationWriter>> BeginGeneration();
  // As BeginGeneration, but the new generation is numbered `g` (a worker
  // bringing its store to the number its job committed), and what is in
  // gen-g already is kept (a part written for that generation before the
  // commit was missed: the manifest committed may name its files).
  // \error FailedPrecondition when g is not above the current generation or
  //        a gen-* directory other than gen-g is numbered g or above; else as
  //        BeginGeneration.
  Result<std::unique_ptr<GenerationWriter>> BeginGenerationAt(uint64_t g);

  // Removes generation directories that are neither current nor in
  // `keep_generations`, and every shard file in any gen-* directory that no
  // current or kept manifest references (files in old generation directories
  // that the current manifest references stay). Leaves directories numbered
  // above the current generation alone. Never follows a symbolic link: a
  // generation directory (or a directory in one) that is a link, e.g. moved to
  // another disk and linked back, is read through but not pruned; once nothing
  // kept lies under it the link itself is removed, never what it points at.
  // \error FailedPrecondition when a GenerationWriter is active, or as BeginGeneration
  //        (the writer lock, a root manifest changed by another writer).
  // \error Corruption when a kept manifest cannot be read; IOError when removal fails.
  Status CollectGarbage(const std::set<uint64_t>& keep_generations = {});

  // ROOT/gen-NNNNNN/manifest.json.
  std::string ManifestPath(uint64_t g) const;

 private:
  friend class GenerationWriter;
  Store(Env* env, std::string root);
  void SetCurrent(std::shared_ptr<const GenerationManifest> m) EXCLUDES(mu_);
  // `abandoned`: the number of a generation this Store began and did not
  // commit (0: none); the next BeginGeneration removes what is left of it even
  // if a manifest.json was written before the commit failed.
  void WriterDone(uint64_t abandoned = 0) EXCLUDES(mu_);
  Status RemoveUncommitted(uint64_t keep = 0);
  Result<std::unique_ptr<GenerationWriter>> Begin(std::optional<uint64_t> at);
  // Takes the writer lock unless this process holds it, then checks that the
  // root manifest still names current_generation(). REQUIRES: writer_active_ set by the caller.
  Status CheckWriter();
  // The number of the next generation: above current and every gen-* directory.
  Result<uint64_t> NextGeneration() const;

  Env* const env_;
  const std::string root_;
  mutable Mutex mu_;
  std::shared_ptr<const GenerationManifest> current_ GUARDED_BY(mu_);  // null: none
  bool writer_active_ GUARDED_BY(mu_) = false;
  std::set<uint64_t> abandoned_ GUARDED_BY(mu_);  // our own uncommitted generations
  StoreLock lock_;                                // OpenForWrite's, for the Store's life
  StoreLock write_lock_;                          // taken by CheckWriter for one writer; released by WriterDone
};

}  // namespace ptc
