// The real clients' Python: the venv tools/setup-deps.sh makes (.venv/ at the
// repository root, or $PTCFS_VENV), and the check that it holds what a suite runs.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "test_util.h"

namespace ptc::testing {

inline std::string Venv() {
  const char* env = std::getenv("PTCFS_VENV");
  return env != nullptr && *env != '\0' ? env : std::string(PTCFS_SOURCE_DIR) + "/.venv";
}

// The command line that runs a client script with the venv's Python: through
// tests/clients/zygote.py, a fork of a server that has imported torch,
// megatron-core, torchtitan and transformers once (what each client process
// imported again, ~8 s of CPU). Followed by the script and its arguments.
inline std::string ClientPython() {
  return "/usr/bin/python3 -S " + std::string(PTCFS_SOURCE_DIR) + "/tests/clients/zygote.py " + Venv() + "/bin/python ";
}

// Exits the test binary with 77 (skipped; under CI a failure) unless the venv's
// python finds every module of MODULES (a Python list, e.g. "'torch', 'numpy'").
// The modules are found, not imported: importing megatron-core takes seconds of
// CPU, and a ctest run starts a suite once per case; the clients import them.
inline void RequireVenv(const std::string& modules) {
  const std::string python = Venv() + "/bin/python";
  auto [code, out] = Sh(python + " -c \"import importlib.util as u, sys; m = [n for n in [" + modules +
                        "] if u.find_spec(n) is None]; sys.exit('missing: ' + ', '.join(m) if m else 0)\"");
  if (code != 0 || access(python.c_str(), X_OK) != 0) {
    std::printf("%s: the venv at %s lacks what this suite runs (make it with tools/setup-deps.sh): %s\n",
                InCi() ? "FAIL" : "SKIP", Venv().c_str(), out.c_str());
    std::exit(InCi() ? 1 : 77);
  }
}

}  // namespace ptc::testing
