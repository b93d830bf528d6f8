#pragma once
// Reading and writing the small JSON files of the tokenizers, with errors
// that name the file (and, for a parse error, the byte offset).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tg::data {

// DataError (prefixed with who) for a missing or unreadable file or invalid JSON.
nlohmann::json read_json_file(const std::string& path, std::string_view who);
// DataError when the file cannot be written.
void write_json_file(const std::string& path, const nlohmann::json& j, std::string_view who);
// j[field], or a DataError naming the file and the missing field.
const nlohmann::json& json_field(const nlohmann::json& j, const std::string& field, const std::string& path,
                                 std::string_view who);
// A tokenizer file's "type" must be type and its "version" 1 (DataError otherwise).
void check_tokenizer_header(const nlohmann::json& j, std::string_view type, const std::string& path,
                            std::string_view who);

}  // namespace tg::data
