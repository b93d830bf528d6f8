// Forward values and gradients of the elementwise ops and sum/mean against
// PyTorch in float64 (tests/fixtures/core.json, written by make_core.py), to
// 1e-10 relative.
#define BOOST_TEST_MODULE core_parity
#include <boost/test/unit_test.hpp>

#include <functional>
#include <map>

#include "autograd/autograd.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;

namespace {

Tensor decode(const json& j) {
  Shape shape(j["shape"].get<std::vector<int64_t>>());
  const json& d = j["data"];
  if (!d.empty() && d[0].is_number_integer() && !d[0].is_number_float())
    return from_vector(d.get<std::vector<int64_t>>(), shape);
  return from_vector(d.get<std::vector<double>>(), shape);
}

using Fn = std::function<Tensor(const std::vector<Tensor>&, const json&)>;
Axes axes_of(const json& a) { return a.contains("axes") ? a["axes"].get<Axes>() : Axes{}; }
bool keepdim_of(const json& a) { return a.value("keepdim", false); }

const std::map<std::string, Fn>& ops() {
  static const std::map<std::string, Fn> m = {
      {"add", [](auto& x, auto&) { return add(x[0], x[1]); }},
      {"sub", [](auto& x, auto&) { return sub(x[0], x[1]); }},
      {"mul", [](auto& x, auto&) { return mul(x[0], x[1]); }},
      {"div", [](auto& x, auto&) { return div(x[0], x[1]); }},
      {"pow", [](auto& x, auto&) { return pow(x[0], x[1]); }},
      {"pow_scalar", [](auto& x, auto& a) { return pow(x[0], a["exponent"].template get<double>()); }},
      {"neg", [](auto& x, auto&) { return neg(x[0]); }},
      {"exp", [](auto& x, auto&) { return exp(x[0]); }},
      {"log", [](auto& x, auto&) { return log(x[0]); }},
      {"sqrt", [](auto& x, auto&) { return sqrt(x[0]); }},
      {"rsqrt", [](auto& x, auto&) { return rsqrt(x[0]); }},
      {"abs", [](auto& x, auto&) { return abs(x[0]); }},
      {"tanh", [](auto& x, auto&) { return tanh(x[0]); }},
      {"sigmoid", [](auto& x, auto&) { return sigmoid(x[0]); }},
      {"relu", [](auto& x, auto&) { return relu(x[0]); }},
      {"gelu", [](auto& x, auto&) { return gelu(x[0]); }},
      {"gelu_tanh", [](auto& x, auto&) { return gelu(x[0], /*tanh_approximation=*/true); }},
      {"softplus", [](auto& x, auto&) { return softplus(x[0]); }},
      {"log_sigmoid", [](auto& x, auto&) { return log_sigmoid(x[0]); }},
      {"clamp", [](auto& x, auto& a) { return clamp(x[0], a["low"].template get<double>(), a["high"].template get<double>()); }},
      {"minimum", [](auto& x, auto&) { return minimum(x[0], x[1]); }},
      {"maximum", [](auto& x, auto&) { return maximum(x[0], x[1]); }},
      {"maximum_broadcast", [](auto& x, auto&) { return maximum(x[0], x[1]); }},
      {"where", [](auto& x, auto&) { return where(x[0], x[1], x[2]); }},
      {"masked_fill", [](auto& x, auto& a) { return masked_fill(x[0], x[1], a["value"].template get<double>()); }},
      {"sum_all", [](auto& x, auto&) { return sum(x[0]); }},
      {"sum_axis1_keepdim", [](auto& x, auto& a) { return sum(x[0], axes_of(a), keepdim_of(a)); }},
      {"sum_axes02", [](auto& x, auto& a) { return sum(x[0], axes_of(a), keepdim_of(a)); }},
      {"mean_all", [](auto& x, auto&) { return mean(x[0]); }},
      {"mean_axis_neg1", [](auto& x, auto& a) { return mean(x[0], axes_of(a), keepdim_of(a)); }},
  };
  return m;
}

void check_close(const Tensor& got, const Tensor& want, const std::string& what) {
  BOOST_TEST_REQUIRE(got.shape() == want.shape(), what << ": shape " << got.shape().str() << " vs " << want.shape().str());
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t k = 0; k < g.size(); ++k)
    BOOST_TEST(std::abs(g[k] - w[k]) <= 1e-10 * std::max(1.0, std::abs(w[k])),
               what << "[" << k << "]: " << g[k] << " vs torch " << w[k]);
}

}  // namespace

BOOST_AUTO_TEST_CASE(elementwise_and_reductions_match_pytorch) {
  const json& fx = fixture("tests/fixtures/core.json");
  BOOST_TEST_REQUIRE(fx["cases"].size() == ops().size());
  for (const json& c : fx["cases"]) {
    const std::string name = c["op"];
    BOOST_TEST_CONTEXT("op " << name) {
      auto it = ops().find(name);
      BOOST_TEST_REQUIRE((it != ops().end()), "no C++ mapping for fixture op " << name);
      std::vector<Tensor> in;
      for (const json& j : c["inputs"]) {
        Tensor t = decode(j);
        if (t.dtype() == DType::f64) t.requires_grad_();
        in.push_back(t);
      }
      Tensor out = it->second(in, c["attrs"]);
      check_close(out, decode(c["out"]), name + " forward");
      sum(mul(out, decode(c["u"]))).backward();
      for (size_t k = 0; k < in.size(); ++k) {
        if (c["grads"][k].is_null()) continue;
        BOOST_TEST_REQUIRE(in[k].grad().defined(), name << ": no gradient for input " << k);
        check_close(in[k].grad(), decode(c["grads"][k]), name + " grad " + std::to_string(k));
      }
    }
  }
}
