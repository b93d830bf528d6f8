// What the programs' progress bars print: durations, counts and rates, slow
// rates included (a rate below one a second reads as seconds per item).
#define BOOST_TEST_MODULE report
#include <boost/test/unit_test.hpp>

#include "report/progress.h"

using namespace tg::report;

BOOST_AUTO_TEST_CASE(durations_and_counts) {
  BOOST_TEST(format_duration(83) == "1:23");
  BOOST_TEST(format_duration(3723) == "1:02:03");
  BOOST_TEST(format_duration(-1) == "?");
  BOOST_TEST(format_count(950) == "950");
  BOOST_TEST(format_count(42100) == "42.1k");
  BOOST_TEST(format_count(3.2e6) == "3.2M");
}

BOOST_AUTO_TEST_CASE(rates_fast_and_slow) {
  BOOST_TEST(format_rate(84200, 2, "tok") == "42.1k tok/s");
  BOOST_TEST(format_rate(3, 2, "rounds") == "2 rounds/s");
  BOOST_TEST(format_rate(1, 1, "rounds") == "1 rounds/s");
  // Below one a second: never "0 rounds/s".
  BOOST_TEST(format_rate(2, 5, "rounds") == "2.5 s/round");
  BOOST_TEST(format_rate(1, 2.04, "contexts") == "2.0 s/context");
  BOOST_TEST(format_rate(3, 75, "rounds") == "25 s/round");
  BOOST_TEST(format_rate(0, 5, "tok") == "");
  BOOST_TEST(format_rate(5, 0, "tok") == "");
}
