// Integer options checked as text, before CLI11 converts them: its strtoull
// takes "-1" as 18446744073709551615 and clamps a number too large to the
// largest of its type, so `--samples 99999999999999999999` would run as
// 2^64-1. Each message names the value and the range, never "non-negative"
// for a value that is too large.
#pragma once

#include <cstdint>

#include <CLI/CLI.hpp>

namespace ptcfs {

// Adds to every option of `app` and its subcommands whose type is an integer
// (CLI11's "INT" / "UINT") a check that its text is an integer of that type:
// "VALUE is out of range (at most N)", "VALUE is negative (0 or more)".
void CheckIntegerOptions(CLI::App& app);

// An integer option's lower bound: "VALUE is below MIN".
CLI::Validator AtLeast(int64_t min);

}  // namespace ptcfs
