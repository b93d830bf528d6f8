// read_text_file on any bytes, as one document and as paragraphs: a
// DataError, or valid UTF-8 documents; as one document, the file's bytes
// without a leading byte-order mark.
#include "data/text.h"
#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tg::fuzz::write_input(data, size, "corpus.txt");
  std::vector<tg::data::Document> whole, paragraphs;
  if (tg::fuzz::accepted([&] { whole = tg::data::read_text_file(path, tg::data::TextSplit::whole); })) {
    std::string_view bytes(reinterpret_cast<const char*>(data), size);
    if (bytes.starts_with("\xEF\xBB\xBF")) bytes.remove_prefix(3);
    tg::fuzz::require(whole.size() == 1 && whole[0].text == bytes, "one document: the file without its BOM");
    tg::fuzz::require(tg::data::find_invalid_utf8(whole[0].text) == -1, "an accepted text is valid UTF-8");
  }
  if (tg::fuzz::accepted([&] { paragraphs = tg::data::read_text_file(path, tg::data::TextSplit::paragraphs); })) {
    tg::fuzz::require(!paragraphs.empty(), "an accepted text has a paragraph");
    for (const auto& d : paragraphs)
      tg::fuzz::require(tg::data::find_invalid_utf8(d.text) == -1, "every paragraph is valid UTF-8");
  }
  return 0;
}
