// ptcfs: parallelizable tensor collections, served as files.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "tools/cli_numbers.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ptcfs keeps a training job's state (model and optimizer tensors) as a parallelizable tensor\n"
      "collection and hands it out in any parallel layout (tp, pp, dp, ZeRO-1), bit for bit.\n\n"
      "Typical flow:\n"
      "  ptcfs synth  --schema llama --dims layers=4,hidden=64,heads=8,kv_heads=4,vocab=512,seq=64 \\\n"
      "               --config tp=2,pp=2 --optimizer adam ckpt/     # or your own per-rank files\n"
      "  ptcfs import --schema llama --dims ... --config tp=2,pp=2 ckpt/ store/\n"
      "  ptcfs plan      store/ --to tp=4,pp=1,dp=2,zero=1            # what would move\n"
      "  ptcfs transform store/ --to tp=4,pp=1,dp=2,zero=1            # new generation in that layout\n"
      "  ptcfs export --config tp=4,pp=1,dp=2,zero=1 store/ out/\n"
      "  ptcfs verify store/",
      "ptcfs"};
  app.require_subcommand(1);
  int exit_code = 0;
  ptcfs::AddSynthCommand(app, &exit_code);
  ptcfs::AddImportCommand(app, &exit_code);
  ptcfs::AddExportCommand(app, &exit_code);
  ptcfs::AddInspectCommand(app, &exit_code);
  ptcfs::AddVerifyCommand(app, &exit_code);
  ptcfs::AddDiffCommand(app, &exit_code);
  ptcfs::AddSchemaCommand(app, &exit_code);
  ptcfs::AddPlanCommand(app, &exit_code);
  ptcfs::AddTransformCommand(app, &exit_code);
  ptcfs::AddCompactCommand(app, &exit_code);
  ptcfs::AddMountCommands(app, &exit_code);
  ptcfs::AddDataCommand(app, &exit_code);
  ptcfs::AddStrategiesCommand(app, &exit_code);
  ptcfs::CheckIntegerOptions(app);
  ptcfs::KeepStandardDescriptorsOpen();
  const std::string command = ptcfs::CommandName(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every usage error is one line and exits 2
    // (docs/cli.md), not CLI11's own lines and codes (104-106 and more).
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "%s: %s (%s --help)\n", command.c_str(), ptcfs::OneLine(e.what()).c_str(), command.c_str());
    return 2;
  }
  return ptcfs::FinishStandardOutput(command, exit_code);
}

#if defined(__SANITIZE_ADDRESS__)
// LeakSanitizer: HDF5 keeps blocks of a failed H5Fcreate (ENOSPC) until its
// atexit cleanup, which h5shard.cc turns off (H5dont_atexit: that cleanup
// crashed after ENOSPC). The blocks are HDF5's, not ours.
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5"; }
extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }
#endif
