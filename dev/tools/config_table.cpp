// Prints the trainers' config schema as Markdown tables, one per group named on the command line (all groups when
// none is), so the docs' tables of keys are generated from the code: docs/cuda.md holds the cuda and comm groups
// between "<!-- config_table GROUP... -->" and "<!-- end config_table -->", and test_docs checks them.
//   build/config_table [GROUP...]
#include <cstdio>
#include <set>
#include <string>

#include "llmc/base/error.h"
#include "llmc/run/config.h"

namespace {

// A Markdown table cell: pipes escaped, so a help text with one cannot end the cell.
std::string cell(std::string s) {
    for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
    return s;
}

int run(int argc, char** argv) {
    const llmc::Schema<llmc::TrainConfig>& schema = llmc::train_config_schema();
    std::set<std::string> known;
    for (const auto& e : schema.entries()) known.insert(e.group);
    for (int i = 1; i < argc; i++)
        LLMC_CHECK(known.count(argv[i]), std::string("config_table: no group '") + argv[i] + "'");
    const llmc::TrainConfig defaults;
    std::string group;
    for (const auto& e : schema.entries()) {
        bool wanted = argc == 1;
        for (int i = 1; i < argc; i++) wanted |= e.group == argv[i];
        if (!wanted) continue;
        if (e.group != group) {
            std::printf("%s**%s**\n\n| key | default | what it does |\n|---|---|---|\n", group.empty() ? "" : "\n",
                        e.group.c_str());
            group = e.group;
        }
        std::string what = e.help;
        if (!e.choices.empty()) {
            what += " — values:";
            for (size_t c = 0; c < e.choices.size(); c++) what += (c ? ", " : " ") + e.choices[c];
        }
        if (!e.note.empty()) what += " (" + e.note + ")";
        std::printf("| `%s` | `%s` | %s |\n", e.name.c_str(), e.to_json(&defaults).dump().c_str(), cell(what).c_str());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
