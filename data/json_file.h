#pragma once
// Reading and writing the small JSON files of the tokenizers, with errors
// that name the file (and, for a parse error, the byte offset).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tg::data {

// DataError (prefixed with who) for a missing or unreadable file, invalid
// JSON (syntax, a number outside the double range) or nesting deeper than
// the tokenizer files have ({"merges": [[101, 32], ...]} is 3 levels). The
// parsed document takes up to ~30 bytes per byte of the file (a value is 16
// bytes, "0," 2 bytes of file, and arrays grow by doubling).
nlohmann::json read_json_file(const std::string& path, std::string_view who);
// DataError when the file cannot be written.
void write_json_file(const std::string& path, const nlohmann::json& j, std::string_view who);
// j[field], or a DataError naming the file and the missing field.
const nlohmann::json& json_field(const nlohmann::json& j, const std::string& field, const std::string& path,
                                 std::string_view who);
// A tokenizer file's "type" must be type and its "version" 1 (DataError otherwise).
void check_tokenizer_header(const nlohmann::json& j, std::string_view type, const std::string& path,
                            std::string_view who);

class CharTokenizer;
class BPETokenizer;
// The tokenizer of a parsed file (path names it in errors): what load() and
// load_tokenizer() build, from one parse of the file.
CharTokenizer char_tokenizer_from_json(const nlohmann::json& j, const std::string& path);
BPETokenizer bpe_tokenizer_from_json(const nlohmann::json& j, const std::string& path);

}  // namespace tg::data
