// read_brown on a directory holding one corpus file `ca01` of any bytes: a
// DataError, or that one document (id ca01, genre a: press).
#include "data/brown.h"
#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tg::fuzz::write_input(data, size, "ca01");
  std::vector<tg::data::BrownDocument> docs;
  if (!tg::fuzz::accepted([&] { docs = tg::data::read_brown(tg::fuzz::scratch_dir()); })) return 0;
  tg::fuzz::require(docs.size() == 1 && docs[0].id == "ca01" && docs[0].genre == 'a', "one document, ca01, genre a");
  tg::fuzz::require(tg::data::brown_documents(docs).size() == 1, "one Document");
  return 0;
}
