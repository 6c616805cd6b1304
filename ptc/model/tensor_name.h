// Tensor names: the one check every entry point applies (schema rules,
// safetensors and Megatron imports, manifests) before a name reaches a file
// name. Names become file names (`tensors/<name>.npy`), so they must not be
// able to name another directory.
#pragma once

#include <cstddef>
#include <string_view>

#include "ptc/base/status.h"

namespace ptc {

// Longest tensor name accepted, in bytes: `<name>.npy` stays under NAME_MAX.
inline constexpr size_t kMaxTensorNameBytes = 240;

// Checks `name`: not empty, not "." or "..", no '/', no NUL or other control
// character (< 0x20, 0x7f), at most kMaxTensorNameBytes bytes. Dots inside a
// name (`layers.0.weight`) are fine.
// \error InvalidArgument "<where>: tensor name '<name, escaped>' <rule>".
Status ValidateTensorName(std::string_view name, std::string_view where);

// `name` with control characters and non-ASCII bytes written as \xHH, cut to
// 80 bytes: safe to print in a message.
std::string EscapeName(std::string_view name);

// Checks a single file name about to be created in a directory: not empty,
// not "." or "..", no '/' or NUL, at most 255 bytes.
// \error InvalidArgument "<dir>: refusing to create '<name>' (<rule>)".
Status ValidateLeafName(std::string_view dir, std::string_view name);

}  // namespace ptc
