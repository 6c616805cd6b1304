// ptcfs verify: every shard's checksum and HDF5 metadata, all reported.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ptc/store/h5shard.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/shard_verify.h"
#include "ptc/store/store.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "worker/serving_check.h"

namespace ptcfs {
namespace {

ptc::Status RunVerify(const std::string& path) {
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(ptc::Env::Default(), path));
  if (!store->has_generation()) {
    std::printf("%s: empty store, nothing to verify\n", path.c_str());
    return ptc::Status::OK();
  }
  const ptc::GenerationManifest& m = store->current();
  const std::vector<const ptc::ShardRecord*> pieces = ptc::DistinctPieces(m);  // each block once
  const std::vector<ptc::ShardRecord> copies = ptc::CopyRecords(m);            // copies in rank files
  uint64_t total = 0;
  for (const ptc::ShardRecord* s : pieces) total += s->nbytes;
  for (const ptc::ShardRecord& c : copies) total += c.nbytes;
  std::vector<std::string> failures;  // printed once the progress line has ended
  {
    Progress progress("verify", total);
    const auto by_name = ptc::TensorsByName(m);  // DecodeManifest checked that each shard's tensor is listed
    for (const ptc::ShardRecord* s : pieces) {
      const ptc::TensorRecord* t = by_name.at(s->tensor);
      ptc::Status st = ptc::VerifyShard(store->env(), *store, *s);
      if (st.ok()) st = ptc::CheckH5Shard(store->AbsPath(s->h5.empty() ? s->file : s->h5), *s, t->dtype);
      if (!st.ok()) failures.push_back(st.message());
      progress.Add(s->nbytes);
    }
    for (const ptc::ShardRecord& c : copies) {
      ptc::Status st = ptc::VerifyShard(store->env(), *store, c);
      if (!st.ok())
        failures.push_back("a copy in rank file " + c.file + " at offset " + std::to_string(c.offset) + ": " +
                           st.message());
      progress.Add(c.nbytes);
    }
  }
  for (const std::string& f : failures) std::fprintf(stderr, "ptcfs verify: %s\n", ptc::Printable(f).c_str());
  const size_t bad = failures.size();
  const std::vector<std::string> problems = worker::ServingProblems(m);
  for (const std::string& p : problems)
    std::fprintf(stderr, "ptcfs verify: %s: %s\n", ptc::Printable(path).c_str(), ptc::Printable(p).c_str());
  if (bad) {
    return ptc::CorruptionError(
        path + ": " + std::to_string(bad) + " of " + std::to_string(pieces.size() + copies.size()) +
        " stored pieces and copies failed verification (generation " + std::to_string(m.generation) + ")");
  }
  if (!problems.empty()) {
    return ptc::CorruptionError(path + ": generation " + std::to_string(m.generation) +
                                " cannot be served in its config (" + std::to_string(problems.size()) + " problem" +
                                (problems.size() == 1 ? "" : "s") + " above)");
  }
  if (m.tensors.empty()) {
    std::printf("%s: generation %llu OK, no tensors (%s)\n", path.c_str(),
                static_cast<unsigned long long>(m.generation),
                m.extra.is_object() && m.extra.contains("dataset") ? "a dataset only" : "empty");
    return ptc::Status::OK();
  }
  std::printf("%s: generation %llu OK, %zu stored pieces%s, %s verified\n", path.c_str(),
              static_cast<unsigned long long>(m.generation), pieces.size(),
              copies.empty() ? "" : (" and " + std::to_string(copies.size()) + " copies in rank files").c_str(),
              HumanBytes(total).c_str());
  return ptc::Status::OK();
}

}  // namespace

void AddVerifyCommand(CLI::App& app, int* exit_code) {
  auto path = std::make_shared<std::string>();
  CLI::App* sub =
      app.add_subcommand("verify",
                         "Check every shard of the current generation: the xxh64 checksum of each 4 MiB block of\n"
                         "its bytes, and the HDF5 dataset's offset, size and attributes against the manifest.\n"
                         "Lists every bad shard (and its first bad block); exit status 1 when any fails.");
  sub->add_option("STORE", *path, "store directory")->required();
  sub->callback([path, exit_code] { *exit_code = Report("verify", RunVerify(*path)); });
}

}  // namespace ptcfs
