// A store holding a synthetic checkpoint, and the check that it still holds
// it: shared by the repartitioning tests (transform_test, covering_test).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/synth_checkpoint.h"
#include "ptc/store/store.h"
#include "test_util.h"
#include "view/export.h"

namespace ptc::testing {

// TMP/store holding synth(spec, config, seed) as generation 1.
inline void MakeStore(const TempDir& tmp, const ModelSpec& spec, const ParallelConfig& config, uint64_t seed) {
  ASSERT_TRUE(WriteSynthCheckpoint(Env::Default(), ptc::testing::FitLayout(spec, config), seed, tmp / "src").ok());
  auto r = ImportCheckpoint(Env::Default(), tmp / "src", tmp / "store", spec.schema, spec.dims, config);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::filesystem::remove_all(tmp / "src");
}

// export(config) of TMP/store equals synth(config, seed), file for file.
inline void ExpectStoreHolds(const TempDir& tmp, const ModelSpec& spec, const ParallelConfig& config, uint64_t seed) {
  auto store = Store::Open(Env::Default(), tmp / "store");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::filesystem::remove_all(tmp / "out");
  std::filesystem::remove_all(tmp / "ref");
  Status s = ptcfs::ExportCheckpoint(**store, config, tmp / "out", CheckpointFormat::kSafetensors);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(WriteSynthCheckpoint(Env::Default(), ptc::testing::FitLayout(spec, config), seed, tmp / "ref").ok());
  ASSERT_TRUE(Snapshot(tmp / "out") == Snapshot(tmp / "ref"))
      << "export of " << config.ToString() << " differs from synth";
}

}  // namespace ptc::testing
