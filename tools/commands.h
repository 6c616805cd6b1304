// The subcommands of the `ptcfs` command line, one file each. Each Add*
// registers its options on `app`; when chosen, its callback runs the command
// and stores the process exit status in `*exit_code` (0 success, 1 failure or
// difference, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

#include "ptc/base/status.h"
#include "ptc/store/store.h"
#include "ptc/store/store_lock.h"

namespace ptcfs {

// --names of `export --format megatron` and `mount` (ptc/checkpoint/megatron/names.h).
inline constexpr const char* kMegatronNamesHelp =
    "Megatron-Core's names in the Megatron files, which also give the parameter order that\n"
    "numbers the optimizer state: te (default; with Transformer Engine, each layer's norms are\n"
    "fused into self_attention.linear_qkv.layer_norm_weight and mlp.linear_fc1.layer_norm_weight)\n"
    "or local (its local layer spec, as on a CPU machine: input_layernorm.weight and\n"
    "pre_mlp_layernorm.weight, each registered before its attention or MLP). Schemas without\n"
    "these norms (megatron-gpt) read the same either way; saves and imports take either set\n"
    "(docs/megatron_format.md)";

// --dcp-names of `export --format dcp` and `mount` (ptc/checkpoint/dcp/dcp.h).
inline constexpr const char* kDcpNamesHelp =
    "the keys of the DCP checkpoint: torch (default: model.P and optim.state.P.K, P the\n"
    "store's (Megatron-Core's) names, as torch flattens {\"model\": ..., \"optim\": ...}) or\n"
    "torchtitan (its Llama names, tok_embeddings.weight, layers.I.attention.qkv_linear.wq.weight,\n"
    "..., wq and wk rows in its RoPE order, optimizer.state.<name>.exp_avg; llama schema only).\n"
    "A save into dcp/ may use either (docs/dcp_format.md)";

void AddSynthCommand(CLI::App& app, int* exit_code);
void AddImportCommand(CLI::App& app, int* exit_code);
void AddExportCommand(CLI::App& app, int* exit_code);
void AddInspectCommand(CLI::App& app, int* exit_code);
void AddVerifyCommand(CLI::App& app, int* exit_code);
void AddDiffCommand(CLI::App& app, int* exit_code);
void AddSchemaCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddTransformCommand(CLI::App& app, int* exit_code);
void AddCompactCommand(CLI::App& app, int* exit_code);
void AddMountCommands(CLI::App& app, int* exit_code);  // mount, reconfigure, umount
void AddDataCommand(CLI::App& app, int* exit_code);
void AddStrategiesCommand(CLI::App& app, int* exit_code);  // cmd_strategies.cc: per length group layouts

// The process's edges (exit_status.cc). Before parsing: descriptors 0-2 that
// are closed are opened on /dev/null (read-only), so no file ptcfs opens takes
// their number. "ptcfs data synth": the command argv names (for both messages). A CLI11 message on
// one line. After the command: flushes stdout; a failed write (a full disk,
// a closed descriptor) is reported and turns exit 0 into 1.
void KeepStandardDescriptorsOpen();
std::string CommandName(const CLI::App& app, int argc, char** argv);
std::string OneLine(std::string text);
int FinishStandardOutput(const std::string& command, int exit_code);

// Prints "ptcfs <command>: <message>" to stderr and returns the exit status
// for `status` (0 when OK, 2 for InvalidArgument/NotFound, else 1).
int Report(const char* command, const ptc::Status& status);

// After a command committed a new generation: removes the older ones
// (Store::CollectGarbage) unless `keep_old`. A failure there does not undo the
// commit: it is printed as a warning naming what was left behind, and the
// command still succeeds (exit 0); the next commit collects again.
void CollectAfterCommit(const char* command, ptc::Store& store, bool keep_old);

// The options of a writing command's StoreLock: this process's command line
// as the holder, `wait` to block (saying on stderr whom it waits for).
ptc::StoreLockOptions WriterLockOptions(bool wait, bool create_dir = false);

// Takes STORE's writer lock for a writing command (docs/store_format.md).
// \error FailedPrecondition when another process holds it and !wait: names the
//        holder and suggests --wait. \error as ptc::StoreLock::Acquire.
ptc::Result<ptc::StoreLock> LockStore(const std::string& store, bool wait, bool create_dir = false);

// The --wait flag of a writing command.
void AddWaitFlag(CLI::App* sub, bool* wait);

// --rank-file-copies of compact and mount (view/rank_files.h, ParseCopyBudget),
// checked as it is parsed (a bad value is a usage error).
void AddRankFileCopiesOption(CLI::App* sub, std::string* value);

}  // namespace ptcfs
