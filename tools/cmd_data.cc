// ptcfs data: the dataset state of a store (docs/dataset_format.md).
//   data synth    a synthetic Megatron .bin/.idx pair
//   data import   a Megatron or JSONL dataset into a store (fingerprint, seed, global batch)
//   data status   where the store is in its data
//   data advance  set the position (step, epoch) in a new generation
//   data view     a rank's view file, rendered to stdout (what the mount will serve)
#include <sys/statvfs.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/json_fields.h"
#include "ptc/dataset/synth.h"
#include "ptc/dataset/view.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct DataArgs {
  // synth
  ptc::SynthDatasetSpec synth{.samples = 0, .min_len = 1, .max_len = 1, .vocab = 0, .seed = 0};
  // import / status / advance / view
  std::string format = "megatron", source, store, buckets, config, file;
  uint64_t global_batch = 0, seed = 0;
  int rank = 0;
  bool json = false;
  bool wait = false;  // import / advance: for the writer lock
  std::optional<uint64_t> step, epoch;
  std::optional<size_t> group;
};

ptc::Result<std::vector<uint64_t>> ParseBuckets(const std::string& text) {
  std::vector<uint64_t> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || part[0] == '-') {
      return ptc::InvalidArgumentError("--length-buckets: '" + part + "' is not a token count");
    }
    out.push_back(v);
  }
  PTC_RETURN_IF_ERROR(ptc::CheckLengthBounds(out));
  return out;
}

ptc::Status RunSynth(const DataArgs& a) {
  PTC_RETURN_IF_ERROR(ptc::CheckSynthSpec(a.synth));
  const uint64_t avg = (a.synth.min_len + a.synth.max_len) / 2;
  // The tokens' bytes, checked against the disk before anything is written.
  uint64_t bytes = 0;
  const uint64_t token_bytes = ptc::SynthDTypeCode(a.synth) == 8 ? 2 : 4;
  const bool overflow = __builtin_mul_overflow(a.synth.samples, avg, &bytes) ||
                        __builtin_mul_overflow(bytes, token_bytes, &bytes);
  // OUT_PREFIX's directory is made as `ptcfs synth` makes OUT_DIR.
  const std::string dir = ptc::DirName(a.source);
  PTC_RETURN_IF_ERROR(ptc::Env::Default()->CreateDirs(dir));
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) == 0 &&
      (overflow || bytes > static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_frsize))) {
    return ptc::InvalidArgumentError(
        "--samples " + std::to_string(a.synth.samples) + " of about " + std::to_string(avg) + " tokens: " +
        (overflow ? std::string("more bytes than 2^64") : "about " + HumanBytes(bytes)) + ", more than the " +
        HumanBytes(static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize) + " free in " + dir);
  }
  Progress progress("synth", bytes);
  PTC_RETURN_IF_ERROR(ptc::WriteSynthDataset(ptc::Env::Default(), a.synth, a.source, progress.fn()));
  std::printf("wrote %s.bin and %s.idx: %llu samples of %s tokens\n", a.source.c_str(), a.source.c_str(),
              static_cast<unsigned long long>(a.synth.samples),
              std::string(ptc::IdxDTypeName(ptc::SynthDTypeCode(a.synth))).c_str());
  return ptc::Status::OK();
}

// Opens the store, or creates it when nothing is there yet.
struct OpenedStore {
  ptc::StoreLock lock;  // the writer lock, taken before the store is read; released last
  std::unique_ptr<ptc::Store> store;
  bool created = false;      // no store was there: a failed import removes it again
  bool dir_existed = false;  // the directory existed (empty) before
};

ptc::Result<OpenedStore> OpenOrCreate(ptc::Env* env, const std::string& root, bool wait) {
  OpenedStore o;
  o.dir_existed = env->Exists(root);
  PTC_ASSIGN_OR_RETURN(o.lock, LockStore(root, wait, /*create_dir=*/true));
  o.created = !env->Exists(ptc::JoinPath(root, "manifest.json"));
  if (o.created) {
    PTC_ASSIGN_OR_RETURN(o.store, ptc::Store::Create(env, root));
  } else {
    PTC_ASSIGN_OR_RETURN(o.store, ptc::Store::Open(env, root));
  }
  return o;
}

// Best effort: leaves a store this command created as it found the directory.
void Uncreate(ptc::Env* env, const std::string& root, bool dir_existed) {
  if (!dir_existed) {
    (void)env->RemoveTree(root);
    return;
  }
  ptc::Result<std::vector<std::string>> names = env->ListDir(root);
  if (names.ok()) {
    for (const std::string& n : *names) (void)env->RemoveTree(ptc::JoinPath(root, n));
  }
}

void PrintState(const ptc::DatasetState& s, uint64_t generation) {
  std::printf("dataset     %s %s\n", std::string(ptc::DatasetFormatName(s.format)).c_str(), s.source.c_str());
  std::printf("samples     %llu, global batch %llu: %llu steps per epoch\n",
              static_cast<unsigned long long>(s.num_samples), static_cast<unsigned long long>(s.global_batch),
              static_cast<unsigned long long>(s.steps_per_epoch()));
  std::printf("position    epoch %llu, step %llu, %llu samples consumed (%.1f%%)\n",
              static_cast<unsigned long long>(s.epoch), static_cast<unsigned long long>(s.step()),
              static_cast<unsigned long long>(s.consumed), 100.0 * s.consumed / s.num_samples);
  std::printf("seed        %llu\n", static_cast<unsigned long long>(s.seed));
  if (!s.length_buckets.empty())
    std::printf("buckets     %s\n", ptc::JsonText(nlohmann::json(s.length_buckets)).c_str());
  std::printf("generation  %llu\n", static_cast<unsigned long long>(generation));
}

ptc::Status RunImport(const DataArgs& a) {
  ptc::Env* env = ptc::Env::Default();
  ptc::DatasetImportOptions o;
  PTC_ASSIGN_OR_RETURN(o.format, ptc::ParseDatasetFormat(a.format));
  PTC_ASSIGN_OR_RETURN(o.length_buckets, ParseBuckets(a.buckets));
  o.source = a.source;
  o.global_batch = a.global_batch;
  o.seed = a.seed;
  PTC_ASSIGN_OR_RETURN(OpenedStore opened, OpenOrCreate(env, a.store, a.wait));
  ptc::Store& store = *opened.store;
  ptc::Result<ptc::DatasetImportResult> r = [&] {
    if (o.format != ptc::DatasetFormat::kJsonl) return ptc::ImportDataset(store, o);
    ptc::Result<uint64_t> size = env->FileSize(a.source);
    Progress progress("scan", size.ok() ? *size : 0);
    return ptc::ImportDataset(store, o, progress.fn());
  }();
  if (!r.ok()) {
    opened.store.reset();
    if (opened.created) Uncreate(env, a.store, opened.dir_existed);
    return r.status();
  }
  std::printf("%s\n", r->committed ? "imported" : "already imported (same dataset and settings): nothing changed");
  PrintState(r->state, store.current_generation());
  return ptc::Status::OK();
}

ptc::Result<ptc::DatasetState> LoadState(const ptc::Store& store) {
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> s, ptc::LoadDatasetState(store));
  if (!s) return ptc::FailedPreconditionError(store.root() + ": no dataset imported (ptcfs data import ...)");
  return *s;
}

ptc::Status RunStatus(const DataArgs& a) {
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(ptc::Env::Default(), a.store));
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> s, ptc::LoadDatasetState(*store));
  if (a.json) {
    nlohmann::json j = {{"store", a.store}, {"generation", store->current_generation()}, {"dataset", nullptr}};
    if (s) {
      j["dataset"] = ptc::EncodeDatasetState(*s);
      j["steps_per_epoch"] = s->steps_per_epoch();
      j["step"] = s->step();
    }
    std::printf("%s\n", ptc::JsonText(j, 2).c_str());
  } else if (s) {
    PrintState(*s, store->current_generation());
  } else {
    std::printf("store       %s\ndataset     none (ptcfs data import ...)\n", a.store.c_str());
  }
  return ptc::Status::OK();
}

ptc::Status RunAdvance(const DataArgs& a) {
  PTC_ASSIGN_OR_RETURN(ptc::StoreLock lock, LockStore(a.store, a.wait));
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::OpenLocked(ptc::Env::Default(), a.store, std::move(lock)));
  PTC_ASSIGN_OR_RETURN(ptc::DatasetState s, LoadState(*store));
  PTC_ASSIGN_OR_RETURN(ptc::DatasetState next, ptc::StateAtStep(s, *a.step, a.epoch));
  PTC_RETURN_IF_ERROR(ptc::CommitDatasetState(*store, next));
  PrintState(next, store->current_generation());
  return ptc::Status::OK();
}

ptc::Status RunView(const DataArgs& a) {
  ptc::Env* env = ptc::Env::Default();
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ParseConfig(a.config));
  if (a.rank < 0 || a.rank >= config.world_size()) {
    return ptc::InvalidArgumentError("--rank " + std::to_string(a.rank) + " is outside [0, " +
                                     std::to_string(config.world_size()) + ") of " + config.ToString());
  }
  PTC_ASSIGN_OR_RETURN(ptc::ViewFile file, ptc::ParseViewFile(a.file));
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::Open(env, a.store));
  PTC_ASSIGN_OR_RETURN(ptc::DatasetState s, LoadState(*store));
  if (a.step || a.epoch) {
    PTC_ASSIGN_OR_RETURN(s, ptc::StateAtStep(s, a.step.value_or(0), a.epoch));
  }
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<const ptc::DatasetSource> source, ptc::OpenDatasetSource(env, *store, s));
  PTC_ASSIGN_OR_RETURN(auto samples, ptc::RankSamplesFor(s, source, config.dp, config.CoordsOf(a.rank).dp, a.group));
  ptc::RankDataView view(source, samples);
  PTC_ASSIGN_OR_RETURN(uint64_t size, view.FileSize(file));
  std::vector<char> buf(1 << 20);
  for (uint64_t off = 0; off < size;) {
    PTC_ASSIGN_OR_RETURN(size_t n, view.Read(file, off, buf.size(), buf.data()));
    if (std::fwrite(buf.data(), 1, n, stdout) != n) return ptc::IOError("writing to stdout failed");
    off += n;
  }
  return std::fflush(stdout) == 0 ? ptc::Status::OK() : ptc::IOError("writing to stdout failed");
}

void AddSynth(CLI::App& data, std::shared_ptr<DataArgs> a, int* exit_code) {
  CLI::App* sub = data.add_subcommand("synth", "Write a synthetic Megatron dataset (.bin + .idx).");
  sub->footer(
      "Write a synthetic Megatron dataset OUT_PREFIX.bin + OUT_PREFIX.idx: sample i has a length in\n"
      "[min-len, max-len] and tokens in [0, vocab), a function of (seed, i) only. Tokens are uint16\n"
      "when the vocabulary fits, else int32. Example:\n"
      "  ptcfs data synth --samples 100000 --min-len 16 --max-len 2048 --vocab 50257 /data/synth");
  sub->add_option("--samples", a->synth.samples, "number of samples (sequences)")->required();
  sub->add_option("--min-len", a->synth.min_len, "shortest sample, in tokens")->required();
  sub->add_option("--max-len", a->synth.max_len, "longest sample, in tokens (inclusive)")->required();
  sub->add_option("--vocab", a->synth.vocab, "vocabulary size")->required();
  sub->add_option("--seed", a->synth.seed, "seed of the lengths and tokens (default 0)");
  sub->add_option("OUT_PREFIX", a->source, "writes OUT_PREFIX.bin and OUT_PREFIX.idx")->required();
  sub->callback([a, exit_code] { *exit_code = Report("data synth", RunSynth(*a)); });
}

void AddImport(CLI::App& data, std::shared_ptr<DataArgs> a, int* exit_code) {
  CLI::App* sub =
      data.add_subcommand("import", "Record a Megatron or JSONL dataset in a store (fingerprint, seed, global batch).");
  sub->footer(
      "Record a dataset in a store: its fingerprint (file sizes + xxh64 of the index), the seed of\n"
      "the per-epoch order and the global batch size, at epoch 0, step 0. The store is created if\n"
      "it does not exist; its tensors are kept. Re-importing the same dataset with the same settings\n"
      "changes nothing; another dataset (fingerprint mismatch) or another global batch is refused.\n"
      "JSONL: one sample per non-blank line; the line index is written to STORE/dataset/.\n"
      "Example:\n"
      "  ptcfs data import --format megatron /data/synth store/ --global-batch 512 --seed 1234");
  sub->add_option("--format", a->format, "megatron (PREFIX.idx + PREFIX.bin) or jsonl")
      ->check(CLI::IsMember({"megatron", "jsonl"}));
  sub->add_option("--global-batch", a->global_batch, "samples per step, constant whatever dp is")->required();
  sub->add_option("--seed", a->seed, "seed of the order; epoch e's order is a function of (seed, e)");
  sub->add_option("--length-buckets", a->buckets,
                  "ascending token bounds, e.g. 4096,16384: groups <=4096 and >4096 (the last group also takes\n"
                  "longer samples); each group is cut among its own dp ranks (megatron only)");
  sub->add_option("PREFIX_OR_FILE", a->source, "Megatron prefix (without .idx/.bin) or .jsonl file")->required();
  sub->add_option("STORE", a->store, "store directory")->required();
  AddWaitFlag(sub, &a->wait);
  sub->callback([a, exit_code] { *exit_code = Report("data import", RunImport(*a)); });
}

void AddStatusAndAdvance(CLI::App& data, std::shared_ptr<DataArgs> a, int* exit_code) {
  CLI::App* st = data.add_subcommand("status", "Show the store's dataset, epoch, step and consumed samples.");
  st->add_flag("--json", a->json, "machine-readable: the state record of docs/dataset_format.md and the step");
  st->add_option("STORE", a->store, "store directory")->required();
  st->callback([a, exit_code] { *exit_code = Report("data status", RunStatus(*a)); });

  CLI::App* adv = data.add_subcommand("advance", "Set the position (step, epoch) in a new generation.");
  adv->footer(
      "Set the position to STEP of the current epoch (consumed = STEP x global batch) in a new\n"
      "generation. Steps run from 0 to the epoch's step count (the end of the epoch)); a step beyond\n"
      "is an error, never a roll-over: start the next epoch with --epoch E+1 --step 0.");
  adv->add_option("--step", a->step, "steps taken in the epoch")->required();
  adv->add_option("--epoch", a->epoch, "the epoch (default: the current one)");
  adv->add_option("STORE", a->store, "store directory")->required();
  AddWaitFlag(adv, &a->wait);
  adv->callback([a, exit_code] { *exit_code = Report("data advance", RunAdvance(*a)); });
}

void AddView(CLI::App& data, std::shared_ptr<DataArgs> a, int* exit_code) {
  CLI::App* sub =
      data.add_subcommand("view", "Write one file of a rank's view (ids.txt, samples.idx/.bin/.jsonl) to stdout.");
  sub->footer(
      "Write one file of a rank's view to stdout, as the mount serves it in data/rank-RRRRR/:\n"
      "  ids.txt        global sample ids the rank reads next, in order, to the end of the epoch\n"
      "                 (zero-padded to the digits of N-1, one per line)\n"
      "  samples.idx    Megatron index of those samples, in that order\n"
      "  samples.bin    their tokens (megatron)\n"
      "  samples.jsonl  their lines (jsonl)\n"
      "Each global batch is cut into dp contiguous near-equal parts, the first (B mod dp) ranks\n"
      "taking one more; ranks with the same dp index (tp/pp peers) see the same files. Example:\n"
      "  ptcfs data view store/ --config tp=2,dp=3 --rank 5 --file ids.txt --step 100 | head");
  sub->add_option("--config", a->config, "parallel config, e.g. tp=2,pp=2,dp=4")->required();
  sub->add_option("--rank", a->rank, "global rank in the config")->required();
  sub->add_option("--file", a->file, "ids.txt, samples.idx, samples.bin or samples.jsonl")->required();
  sub->add_option("--step", a->step, "view as of this step (default: the stored position)");
  sub->add_option("--epoch", a->epoch, "view as of this epoch (default: the stored one)");
  sub->add_option("--group", a->group,
                  "length group (0-based) when the dataset has length buckets;\n"
                  "--config is then that group's config");
  sub->add_option("STORE", a->store, "store directory")->required();
  sub->callback([a, exit_code] { *exit_code = Report("data view", RunView(*a)); });
}

}  // namespace

void AddDataCommand(CLI::App& app, int* exit_code) {
  CLI::App* data = app.add_subcommand("data", "Dataset state: which samples each data-parallel rank reads next.");
  data->footer(
      "The dataset state: which samples each data-parallel rank reads next. The order of an epoch\n"
      "is a seeded permutation; each global batch is cut among the dp ranks, so any change of dp\n"
      "between steps consumes every sample exactly once, in the order of an unchanged run.\n"
      "  ptcfs data synth --samples 10000 --min-len 8 --max-len 512 --vocab 32000 /tmp/ds\n"
      "  ptcfs data import --format megatron /tmp/ds store/ --global-batch 64\n"
      "  ptcfs data advance store/ --step 20\n"
      "  ptcfs data view store/ --config dp=3 --rank 1 --file samples.bin > rank1.bin");
  data->require_subcommand(1);
  auto a = std::make_shared<DataArgs>();
  AddSynth(*data, a, exit_code);
  AddImport(*data, a, exit_code);
  AddStatusAndAdvance(*data, a, exit_code);
  AddView(*data, a, exit_code);
  // CLI11 reads "-1" into an unsigned option as 2^64-1: refuse a sign instead.
  const CLI::Validator not_negative(
      [](std::string& text) {
        return text.starts_with('-') ? "must not be negative (got " + text + ")" : std::string();
      },
      "", "not negative");
  for (CLI::App* sub : data->get_subcommands({})) {
    for (CLI::Option* opt : sub->get_options()) {
      if (opt->get_type_name() == "UINT") opt->check(not_negative);
    }
  }
}

}  // namespace ptcfs
