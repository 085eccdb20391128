// JSON Lines (one JSON object per line; blank lines carry nothing), as prepro_gpt2 reads corpora and eval_gpt
// reads HellaSwag: one rule for what a blank line is and one set of messages for a line that is not an object.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace llmc {

// Blank lines hold only these (a CRLF file's empty line is "\r").
constexpr bool is_blank_char(char c) { return c == ' ' || c == '\t' || c == '\r'; }
bool is_blank_line(std::string_view line);

// The line as a JSON object. Otherwise fails with `where` (FILE:LINE) first: malformed JSON (with the parser's
// reason) or a value of another type.
nlohmann::json parse_json_object(std::string_view line, const std::string& where);

}  // namespace llmc
