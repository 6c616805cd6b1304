#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before bench/device_check.sh: copies the
# header-only and static dependencies that the GPU machine's image lacks
# (nlohmann/json, GoogleTest, NCCL's header as a fallback) into .device-deps/,
# which .git/info/exclude ignores and the device tool carries
# (run(command="bash bench/device_check.sh", carry=[".device-deps"])).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .device-deps
mkdir -p .device-deps/include .device-deps/lib
cp -r /usr/include/nlohmann /usr/include/gtest .device-deps/include/
cp /usr/lib/x86_64-linux-gnu/libgtest.a .device-deps/lib/
for h in /usr/local/include/nccl.h /usr/include/nccl.h /usr/local/cuda/include/nccl.h; do
  if [ -f "$h" ]; then cp "$h" .device-deps/include/; break; fi
done
grep -qx '/.device-deps/' .git/info/exclude 2>/dev/null || echo '/.device-deps/' >> .git/info/exclude
du -sh .device-deps
