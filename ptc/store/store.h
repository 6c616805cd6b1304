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
// Thread safety: Store's const methods may be called from any thread. At most
// one GenerationWriter exists at a time; it must not outlive its Store.
// current() returns a reference that a Commit replaces: readers that run
// concurrently with a writer use CurrentSnapshot().
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "ptc/base/env.h"
#include "ptc/base/mutex.h"
#include "ptc/base/status.h"
#include "ptc/store/manifest.h"
#include "ptc/store/store_layout.h"

namespace ptc {

class GenerationWriter;

class Store {
 public:
  // Creates a store at `root`, which must not exist or be an empty directory;
  // writes manifest.json with generation 0 (no generation yet).
  // \error AlreadyExists when `root` is a file or a non-empty directory.
  // \error IOError (or an injected error) when writing fails.
  static Result<std::unique_ptr<Store>> Create(Env* env, std::string root);

  // Opens the store at `root` and loads its current generation manifest.
  // \error NotFound when ROOT/manifest.json does not exist ("ROOT/manifest.json: ...").
  // \error Corruption when it is not a store manifest, or the generation it names is
  //        missing or its manifest is invalid (message names the file).
  static Result<std::unique_ptr<Store>> Open(Env* env, std::string root);

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

  // Starts generation current+1, first removing any leftover uncommitted
  // gen-NNNNNN directories numbered above the current generation.
  // \error FailedPrecondition when another GenerationWriter is active.
  // \error IOError (or injected) when the directory cannot be prepared.
  Result<std::unique_ptr<GenerationWriter>> BeginGeneration();

  // Removes generation directories that are neither current nor in
  // `keep_generations`, and every shard file in any gen-* directory that no
  // current or kept manifest references (files in old generation directories
  // that the current manifest references stay). Leaves directories numbered
  // above the current generation alone.
  // \error FailedPrecondition when a GenerationWriter is active.
  // \error Corruption when a kept manifest cannot be read; IOError when removal fails.
  Status CollectGarbage(const std::set<uint64_t>& keep_generations = {});

  // ROOT/gen-NNNNNN/manifest.json.
  std::string ManifestPath(uint64_t g) const;

 private:
  friend class GenerationWriter;
  Store(Env* env, std::string root);
  void SetCurrent(std::shared_ptr<const GenerationManifest> m) EXCLUDES(mu_);
  void WriterDone() EXCLUDES(mu_);
  Status RemoveUncommitted();

  Env* const env_;
  const std::string root_;
  mutable Mutex mu_;
  std::shared_ptr<const GenerationManifest> current_ GUARDED_BY(mu_);  // null: none
  bool writer_active_ GUARDED_BY(mu_) = false;
};

}  // namespace ptc
