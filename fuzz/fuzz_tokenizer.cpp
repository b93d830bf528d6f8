// load_tokenizer on any bytes (char and BPE files): a DataError, or a
// tokenizer whose tokens decode to text that encodes back to the same text
// (BPE: decode(encode(s)) == s; char: every token is a character it knows).
#include <algorithm>
#include <memory>
#include <numeric>

#include "data/tokenizer.h"
#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tg::fuzz::write_input(data, size, "tokenizer.json");
  std::unique_ptr<tg::data::Tokenizer> tok;
  if (!tg::fuzz::accepted([&] { tok = tg::data::load_tokenizer(path); })) return 0;
  tg::fuzz::require(tok->vocab_size() > 0, "an accepted tokenizer has tokens");
  // The first 1024 ids (every id of a small file), each once.
  std::vector<int64_t> ids(std::min<int64_t>(tok->vocab_size(), 1024));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  const std::string text = tok->decode(ids);
  tg::fuzz::require(tok->decode(tok->encode(text)) == text, "decode(encode(decode(ids))) == decode(ids)");
  for (int64_t id : ids) tok->token(id);
  return 0;
}
