// ptcfs schema: print a built-in schema (a starting point for your own).
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "ptc/model/schema.h"
#include "tools/commands.h"

namespace ptcfs {

void AddSchemaCommand(CLI::App& app, int* exit_code) {
  auto name = std::make_shared<std::string>();
  CLI::App* sub =
      app.add_subcommand("schema",
                         "Print a schema as JSON: a built-in (megatron-gpt, llama) or a file, checked. Save one and\n"
                         "edit it to describe another model; the format is in docs/schema_format.md.");
  sub->add_option("NAME", *name, "megatron-gpt, llama or a path")->required();
  sub->callback([name, exit_code] {
    auto schema = ptc::LoadSchema(*name);
    *exit_code = Report("schema", schema.status());
    if (schema.ok()) std::printf("%s\n", schema->ToJson().dump(2).c_str());
  });
}

}  // namespace ptcfs
