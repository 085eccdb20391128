// JSON Lines parsing shared by prepro_gpt2 and the multiple-choice reader (see json_lines.h).
#include "llmc/base/json_lines.h"

#include <algorithm>

#include "llmc/base/error.h"

namespace llmc {

bool is_blank_line(std::string_view line) { return std::all_of(line.begin(), line.end(), is_blank_char); }

nlohmann::json parse_json_object(std::string_view line, const std::string& where) {
    nlohmann::json object;
    try {
        object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        fail(where + ": malformed JSON (" + e.what() + ")");
    }
    LLMC_CHECK(object.is_object(), where + ": expected a JSON object, got " + std::string(object.type_name()));
    return object;
}

}  // namespace llmc
