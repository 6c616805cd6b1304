// The JSON text of the built-in schemas (megatron-gpt, llama); empty for an
// unknown name. Kept as data so that `ptcfs schema NAME` prints exactly what
// a user would write in a schema file.
#pragma once

#include <string_view>

namespace ptc {

std::string_view BuiltinSchemaText(std::string_view name);

}  // namespace ptc
