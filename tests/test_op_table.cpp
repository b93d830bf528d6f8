// Walks the op table and gradchecks every op over every one of its samples in
// float64. Ops registered later (in any op-family file) are picked up
// automatically: the table is the single source of truth.
#define BOOST_TEST_MODULE op_table
#include <boost/test/unit_test.hpp>

#include <set>
#include <string>

#include "autograd/autograd.h"
#include "autograd/op.h"

using namespace tg;

BOOST_AUTO_TEST_CASE(every_op_has_samples) {
  std::vector<const OpDef*> ops = op_table();
  BOOST_TEST_REQUIRE(ops.size() >= 30u);  // elementwise + view ops alone are more than that
  std::set<std::string_view> names;
  for (const OpDef* op : ops) {
    BOOST_TEST_CONTEXT("op " << op->name) {
      BOOST_TEST(names.insert(op->name).second, "op name registered twice");
      BOOST_TEST(!op->signature.empty());
      BOOST_TEST(!op->saves.empty());
      BOOST_TEST(op->backward != nullptr);
      BOOST_TEST_REQUIRE(op->samples != nullptr, "op has no sample function");
      std::vector<OpSample> s = op->samples();
      BOOST_TEST(!s.empty(), "op has an empty sample list");
      for (const OpSample& sample : s) {
        BOOST_TEST(!sample.desc.empty());
        BOOST_TEST(static_cast<bool>(sample.fn), "sample '" << sample.desc << "' has no function");
      }
    }
  }
  BOOST_TEST(find_op("mul") != nullptr);
  BOOST_TEST(find_op("no_such_op") == nullptr);
}

BOOST_AUTO_TEST_CASE(every_sample_requires_float64_grad) {
  for (const OpDef* op : op_table()) {
    for (const OpSample& sample : op->samples()) {
      int differentiable = 0;
      for (const Tensor& t : sample.inputs) {
        if (!t.defined() || !t.requires_grad()) continue;
        ++differentiable;
        BOOST_TEST((t.dtype() == DType::f64), op->name << " / " << sample.desc << ": a differentiable input is "
                                                       << dtype_name(t.dtype()));
      }
      BOOST_TEST(differentiable > 0, op->name << " / " << sample.desc << ": no input requires grad");
    }
  }
}

// The sample must record the op it belongs to, otherwise the op's backward is
// never exercised by its own samples.
BOOST_AUTO_TEST_CASE(every_sample_records_its_op) {
  for (const OpDef* op : op_table()) {
    for (const OpSample& sample : op->samples()) {
      tape().clear();
      Tensor out = sample.fn(sample.inputs);
      bool found = false;
      for (size_t k = 0; k < tape().size(); ++k) found |= tape().node(k).op == op;
      BOOST_TEST(found, op->name << " / " << sample.desc << ": the sample does not record '" << op->name << "'");
      tape().clear();
    }
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_every_op_float64) {
  int checked = 0;
  for (const OpDef* op : op_table()) {
    for (const OpSample& sample : op->samples()) {
      GradcheckReport r;
      try {
        r = gradcheck(sample.fn, sample.inputs);
      } catch (const std::exception& e) {
        BOOST_ERROR(op->name << " / " << sample.desc << ": threw " << e.what());
        continue;
      }
      BOOST_TEST(r.passed, op->name << " / " << sample.desc << ":\n" << r.str());
      ++checked;
    }
  }
  BOOST_TEST_MESSAGE("gradchecked " << checked << " samples");
  BOOST_TEST(checked >= 60);
}
