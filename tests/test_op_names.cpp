// The exact set of ops in the op table. Every op family's OpDefs register
// themselves as the library loads; this program calls no op, so an op family
// that a link leaves out shows here. The expected names are the OpDefs that
// the library's sources define (op_names.h, written at build time by
// tests/op_names.py), so there is no second list to keep. Built twice, against
// the static and against the shared library.
#define BOOST_TEST_MODULE op_names
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <string_view>

#include "autograd/op.h"
#include "op_names.h"

namespace {

std::string join(const std::set<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) out += std::string(out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(op_table_holds_exactly_the_library_ops) {
  std::set<std::string_view> registered;
  for (const tg::OpDef* op : tg::op_table()) registered.insert(op->name);
  std::set<std::string_view> missing, unexpected;
  std::ranges::set_difference(kOpsInSources, registered, std::inserter(missing, missing.end()));
  std::ranges::set_difference(registered, kOpsInSources, std::inserter(unexpected, unexpected.end()));
  BOOST_TEST(missing.empty(), "ops missing from op_table(): " << join(missing));
  BOOST_TEST(unexpected.empty(), "ops in op_table() but defined in no source file tests/op_names.py read: " << join(unexpected));
  BOOST_TEST(registered.size() == kOpsInSources.size());
}
