// The subcommands of the `ptcfs` command line, one file each. Each Add*
// registers its options on `app`; when chosen, its callback runs the command
// and stores the process exit status in `*exit_code` (0 success, 1 failure or
// difference, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

#include "ptc/base/status.h"

namespace ptcfs {

void AddSynthCommand(CLI::App& app, int* exit_code);
void AddImportCommand(CLI::App& app, int* exit_code);
void AddExportCommand(CLI::App& app, int* exit_code);
void AddInspectCommand(CLI::App& app, int* exit_code);
void AddVerifyCommand(CLI::App& app, int* exit_code);
void AddDiffCommand(CLI::App& app, int* exit_code);
void AddSchemaCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddTransformCommand(CLI::App& app, int* exit_code);
void AddMountCommands(CLI::App& app, int* exit_code);  // mount, reconfigure, umount
void AddDataCommand(CLI::App& app, int* exit_code);

// Prints "ptcfs <command>: <message>" to stderr and returns the exit status
// for `status` (0 when OK, 2 for InvalidArgument/NotFound, else 1).
int Report(const char* command, const ptc::Status& status);

}  // namespace ptcfs
