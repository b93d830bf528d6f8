// Tensors: factories, dtypes, views without copies, broadcasting, printing,
// generator determinism, the caching allocator, and every error path.
#define BOOST_TEST_MODULE tensor
#include <boost/test/unit_test.hpp>

#include <string>

#include "autograd/autograd.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
namespace tt = boost::test_tools;

namespace {

std::vector<double> values(const Tensor& t) { return t.to(DType::f64).to_vector<double>(); }
bool same_storage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }
// 0, 1, ..., n-1 as float64 of the given shape.
Tensor iota(const Shape& s) { return arange(0.0, static_cast<double>(s.numel()), 1.0, DType::f64).reshape(s); }

}  // namespace

// ============================ factories and dtypes ============================
BOOST_AUTO_TEST_CASE(factories) {
  Tensor z = zeros({2, 3});
  BOOST_TEST(z.shape() == (Shape{2, 3}));
  BOOST_TEST((z.dtype() == DType::f32));
  BOOST_TEST(z.strides() == (Shape{3, 1}));
  BOOST_TEST(z.is_contiguous());
  BOOST_TEST(values(z) == std::vector<double>(6, 0.0), tt::per_element());
  BOOST_TEST(values(ones({4}, DType::f64)) == std::vector<double>(4, 1.0), tt::per_element());
  BOOST_TEST(values(full({2, 2}, -2.5)) == std::vector<double>(4, -2.5), tt::per_element());
  Tensor s = scalar(7.0, DType::f64);
  BOOST_TEST(s.dim() == 0);
  BOOST_TEST(s.numel() == 1);
  BOOST_TEST(s.item<double>() == 7.0);
  BOOST_TEST(values(arange(1.0, 2.0, 0.25)) == (std::vector<double>{1.0, 1.25, 1.5, 1.75}), tt::per_element());
  BOOST_TEST(values(arange(3.0, 0.0, -1.0, DType::f64)) == (std::vector<double>{3, 2, 1}), tt::per_element());
  Tensor idx = arange(4);
  BOOST_TEST((idx.dtype() == DType::i64));
  BOOST_TEST(idx.to_vector<int64_t>() == (std::vector<int64_t>{0, 1, 2, 3}), tt::per_element());
  BOOST_TEST(arange(0.0, -1.0).numel() == 0);
  Tensor v = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  BOOST_TEST(v.at({2, 1}) == 6.0);
  BOOST_TEST(v.at({-1, 0}) == 5.0);
  BOOST_TEST((tensor({1.0, 2.0}).dtype() == DType::f64));
  BOOST_TEST((tensor({int64_t{1}, int64_t{2}}).dtype() == DType::i64));
  // Integer literals alone, or mixed with an int64_t, make int64 (as torch.tensor([1, 2]) does).
  BOOST_TEST((tensor({int64_t{1}, 2}).to_vector<int64_t>() == std::vector<int64_t>{1, 2}), tt::per_element());
  BOOST_TEST((tensor({3, -4}).to_vector<int64_t>() == std::vector<int64_t>{3, -4}), tt::per_element());
  BOOST_TEST((tensor({1.5f, 2.f}).dtype() == DType::f32));
  BOOST_TEST(tensor({1.5f, 2.f}).to_vector<float>() == (std::vector<float>{1.5f, 2.f}), tt::per_element());
  BOOST_TEST(tensor({0.25, 2.0}).to_vector<double>() == (std::vector<double>{0.25, 2.0}), tt::per_element());
  BOOST_TEST(zeros_like(v).shape() == v.shape());
  BOOST_TEST(values(ones_like(v)) == std::vector<double>(6, 1.0), tt::per_element());
  BOOST_TEST(empty({0, 3}).numel() == 0);
  // No elements: contiguous whatever the strides, as in PyTorch (the strides
  // of the axes after a 0 are 1, not 0, and once made (0,0) say otherwise).
  for (const Shape& s : {Shape{0}, Shape{0, 0}, Shape{2, 0, 3}, Shape{3, 0}})
    BOOST_TEST(empty(s).is_contiguous(), s.str());
  Tensor none = empty({2, 0, 3});
  BOOST_TEST(same_storage(none.contiguous(), none));  // no copy
  float buf[4] = {1, 2, 3, 4};
  Tensor blob = from_blob(buf, {2, 2}, DType::f32);
  buf[3] = 9;
  BOOST_TEST(blob.at({1, 1}) == 9.0);  // a view of the caller's memory, not a copy
}

BOOST_AUTO_TEST_CASE(dtype_conversion) {
  Tensor a = tensor({1.5f, -2.25f, 3.0f});
  BOOST_TEST(a.to(DType::f32).impl() == a.impl());  // itself when the dtype matches
  Tensor d = a.to(DType::f64);
  BOOST_TEST((d.dtype() == DType::f64));
  BOOST_TEST(d.to_vector<double>() == (std::vector<double>{1.5, -2.25, 3.0}), tt::per_element());
  Tensor i = d.to(DType::i64);  // truncation toward zero, like a C++ cast
  BOOST_TEST(i.to_vector<int64_t>() == (std::vector<int64_t>{1, -2, 3}), tt::per_element());
  BOOST_TEST(i.to(DType::f32).to_vector<float>() == (std::vector<float>{1, -2, 3}), tt::per_element());
  BOOST_TEST(itemsize(DType::f32) == 4u);
  BOOST_TEST(itemsize(DType::i64) == 8u);
  BOOST_TEST(dtype_name(DType::f64) == "float64");
  // Non-contiguous conversion keeps the logical order.
  BOOST_TEST(values(iota({2, 3}).t().to(DType::f32)) == (std::vector<double>{0, 3, 1, 4, 2, 5}), tt::per_element());
}

// ============================ views ============================
BOOST_AUTO_TEST_CASE(reshape_and_view_share_storage) {
  Tensor x = iota({2, 3, 4});
  Tensor r = x.reshape({6, -1});
  BOOST_TEST(r.shape() == (Shape{6, 4}));
  BOOST_TEST(same_storage(r, x));
  BOOST_TEST(x.view({4, 6}).strides() == (Shape{6, 1}));
  BOOST_TEST(same_storage(x.view({24}), x));
  BOOST_TEST(x.flatten().shape() == (Shape{24}));
  BOOST_TEST(x.flatten(1).shape() == (Shape{2, 12}));
  // A transposed tensor cannot be flattened as a view: reshape copies, view refuses.
  Tensor t = x.transpose(0, 2);
  Tensor c = t.reshape({24});
  BOOST_TEST(!same_storage(c, x));
  BOOST_TEST(c.at({1}) == 12.0);  // t[0,0,1] = x[1,0,0]
  check_throws<ShapeError>([&] { t.view({24}); }, {"view", "(4,3,2)", "reshape"});
  // Splitting a dim of a transposed view is still a view.
  Tensor s = t.reshape({2, 2, 3, 2});
  BOOST_TEST(same_storage(s, x));
  BOOST_TEST(s.at({1, 0, 2, 1}) == x.at({1, 2, 2}));
  // Writes through a view are visible in the base.
  x.view({24}).narrow(0, 5, 1).fill_(-1.0);
  BOOST_TEST(x.at({0, 1, 1}) == -1.0);
}

BOOST_AUTO_TEST_CASE(transpose_and_permute) {
  Tensor x = iota({2, 3, 4});
  Tensor t = x.transpose(0, 1);
  BOOST_TEST(t.shape() == (Shape{3, 2, 4}));
  BOOST_TEST(t.strides() == (Shape{4, 12, 1}));
  BOOST_TEST(same_storage(t, x));
  BOOST_TEST(!t.is_contiguous());
  BOOST_TEST(t.at({2, 1, 3}) == x.at({1, 2, 3}));
  Tensor p = x.permute({2, 0, 1});
  BOOST_TEST(p.shape() == (Shape{4, 2, 3}));
  BOOST_TEST(p.strides() == (Shape{1, 12, 4}));
  BOOST_TEST(p.at({3, 1, 2}) == x.at({1, 2, 3}));
  BOOST_TEST(x.transpose(-1, -2).shape() == (Shape{2, 4, 3}));
  Tensor m = iota({2, 3});
  BOOST_TEST(values(m.t()) == (std::vector<double>{0, 3, 1, 4, 2, 5}), tt::per_element());
  Tensor c = m.t().contiguous();
  BOOST_TEST(c.is_contiguous());
  BOOST_TEST(!same_storage(c, m));
  BOOST_TEST(c.strides() == (Shape{2, 1}));
  BOOST_TEST(m.contiguous().impl() == m.impl());  // already contiguous: itself
}

BOOST_AUTO_TEST_CASE(slice_narrow_select) {
  Tensor x = iota({4, 6});
  Tensor s = x.slice(1, 1, 6, 2);  // x[:, 1:6:2]
  BOOST_TEST(s.shape() == (Shape{4, 3}));
  BOOST_TEST(s.strides() == (Shape{6, 2}));
  BOOST_TEST(s.offset() == 1);
  BOOST_TEST(same_storage(s, x));
  BOOST_TEST(values(s.select(0, 1)) == (std::vector<double>{7, 9, 11}), tt::per_element());
  // Python semantics: negative and out-of-range bounds clamp.
  BOOST_TEST(values(x.select(0, 0).slice(0, -2, 100)) == (std::vector<double>{4, 5}), tt::per_element());
  BOOST_TEST(x.slice(0, 3, 1).shape() == (Shape{0, 6}));
  Tensor n = x.narrow(0, 1, 2);
  BOOST_TEST(n.shape() == (Shape{2, 6}));
  BOOST_TEST(n.offset() == 6);
  BOOST_TEST(n.is_contiguous());
  Tensor col = x.select(1, -1);
  BOOST_TEST(col.shape() == (Shape{4}));
  BOOST_TEST(col.strides() == (Shape{6}));
  BOOST_TEST(values(col) == (std::vector<double>{5, 11, 17, 23}), tt::per_element());
  BOOST_TEST(same_storage(col, x));
}

BOOST_AUTO_TEST_CASE(expand_squeeze_unsqueeze) {
  Tensor x = iota({3, 1});
  Tensor e = x.expand({2, 3, 4});
  BOOST_TEST(e.shape() == (Shape{2, 3, 4}));
  BOOST_TEST(e.strides() == (Shape{0, 1, 0}));
  BOOST_TEST(same_storage(e, x));
  BOOST_TEST(e.at({1, 2, 3}) == 2.0);
  BOOST_TEST(x.expand({-1, 5}).shape() == (Shape{3, 5}));
  Tensor u = x.unsqueeze(0);
  BOOST_TEST(u.shape() == (Shape{1, 3, 1}));
  BOOST_TEST(same_storage(u, x));
  BOOST_TEST(x.unsqueeze(-1).shape() == (Shape{3, 1, 1}));
  Tensor q = x.squeeze(1);
  BOOST_TEST(q.shape() == (Shape{3}));
  BOOST_TEST(values(q) == (std::vector<double>{0, 1, 2}), tt::per_element());
  BOOST_TEST(same_storage(q, x));
}

BOOST_AUTO_TEST_CASE(view_gradients_flow_back_to_the_base) {
  Tensor x = iota({2, 3});
  x.requires_grad_();
  Tensor y = sum(mul(x.t().slice(0, 0, 3, 2), 2.0));  // x[:, 0] and x[:, 2], doubled
  y.backward();
  BOOST_TEST(values(x.grad()) == (std::vector<double>{2, 0, 2, 2, 0, 2}), tt::per_element());
}

// ============================ broadcasting ============================
BOOST_AUTO_TEST_CASE(broadcasting) {
  BOOST_TEST(broadcast_shapes({3, 1}, {4}, "t") == (Shape{3, 4}));
  BOOST_TEST(broadcast_shapes({2, 1, 3}, {4, 1}, "t") == (Shape{2, 4, 3}));
  BOOST_TEST(broadcast_shapes({}, {5}, "t") == (Shape{5}));
  Tensor a = iota({3, 1}), b = iota({4});
  Tensor c = add(a, b);
  BOOST_TEST(c.shape() == (Shape{3, 4}));
  BOOST_TEST(c.at({2, 3}) == 5.0);
  BOOST_TEST(values(mul(iota({2, 2}), scalar(3.0, DType::f64))) == (std::vector<double>{0, 3, 6, 9}), tt::per_element());
  // Broadcast against a strided, expanded view.
  Tensor e = iota({1, 3}).expand({2, 3});
  BOOST_TEST(values(sub(e, iota({2, 1}))) == (std::vector<double>{0, 1, 2, -1, 0, 1}), tt::per_element());
  check_throws<ShapeError>([] { add(ones({2, 3}), ones({4})); }, {"add", "(2,3)", "(4)"});
  check_throws<ShapeError>([] { broadcast_shapes({2, 3}, {3, 3}, "myop"); }, {"myop"});
}

// ============================ printing ============================
BOOST_AUTO_TEST_CASE(printing) {
  std::string s = fmt::format("{}", from_vector(std::vector<float>{1, 2.5f, -3, 4, 5, 6}, {2, 3}));
  BOOST_TEST(s.find("[[1, 2.5, -3],") != std::string::npos, s);
  BOOST_TEST(s.find("[4, 5, 6]]") != std::string::npos, s);
  BOOST_TEST(s.find("shape=(2,3)") != std::string::npos, s);
  BOOST_TEST(s.find("dtype=float32") != std::string::npos, s);
  BOOST_TEST(s.find("requires_grad") == std::string::npos, s);
  Tensor g = tensor({1.0});
  g.requires_grad_();
  BOOST_TEST(g.str().find("dtype=float64, requires_grad") != std::string::npos, g.str());
  BOOST_TEST(arange(3).str() == "tensor([0, 1, 2], shape=(3), dtype=int64)");
  BOOST_TEST(scalar(2.0).str() == "tensor(2, shape=(), dtype=float32)");
  BOOST_TEST(Tensor().str() == "tensor(undefined)");
  // Large tensors are truncated to the first and last 3 entries of each axis.
  std::string big = arange(0.0, 2000.0, 1.0, DType::f64).reshape({40, 50}).str();
  BOOST_TEST(big.find("[[0, 1, 2, ..., 47, 48, 49],") != std::string::npos, big);
  BOOST_TEST(big.find("[1950, 1951, 1952, ..., 1997, 1998, 1999]]") != std::string::npos, big);
  BOOST_TEST(big.find("1000") == std::string::npos, big);
  BOOST_TEST(big.size() < 400u);
  // Small tensors are printed whole; non-contiguous views print in logical order.
  BOOST_TEST(iota({2, 2}).t().str().find("[[0, 2],\n") != std::string::npos);
}

// ============================ generator ============================
BOOST_AUTO_TEST_CASE(generator_determinism) {
  const int threads = num_threads();
  // Large enough to be split across threads (above the fill's grain).
  const Shape big{300, 400};
  std::vector<std::vector<double>> runs;
  for (int n : {1, 2}) {
    set_num_threads(n);
    BOOST_TEST(num_threads() == n);
    Generator g(1234);
    runs.push_back(values(randn(big, DType::f64, &g)));
    runs.push_back(values(rand(big, DType::f32, &g, -2.0, 3.0)));
    runs.push_back(values(randint(0, 10, {1000}, &g)));
  }
  set_num_threads(threads);
  for (size_t k = 0; k < 3; ++k) BOOST_TEST(runs[k] == runs[k + 3], tt::per_element());
  // The draws are plausible: mean ~0, std ~1 for randn; range for rand.
  double m = 0, v = 0;
  for (double x : runs[0]) m += x;
  m /= runs[0].size();
  for (double x : runs[0]) v += (x - m) * (x - m);
  v /= runs[0].size();
  BOOST_TEST(std::abs(m) < 0.01);
  BOOST_TEST(std::abs(v - 1.0) < 0.02);
  for (double x : runs[1]) BOOST_TEST_REQUIRE((x >= -2.0 && x < 3.0));
  for (double x : runs[2]) BOOST_TEST_REQUIRE((x >= 0 && x < 10 && x == std::floor(x)));
  // Different seeds differ; consecutive draws differ; manual_seed restarts.
  Generator a(1), b(2);
  BOOST_TEST(values(rand({8}, DType::f64, &a)) != values(rand({8}, DType::f64, &b)));
  Generator c(5);
  std::vector<double> first = values(rand({8}, DType::f64, &c));
  BOOST_TEST(first != values(rand({8}, DType::f64, &c)));
  BOOST_TEST(c.offset() == 16u);
  c.manual_seed(5);
  BOOST_TEST(first == values(rand({8}, DType::f64, &c)), tt::per_element());
  // The default generator follows tg::manual_seed.
  manual_seed(77);
  std::vector<double> d1 = values(randn({5}, DType::f64));
  manual_seed(77);
  BOOST_TEST(d1 == values(randn({5}, DType::f64)), tt::per_element());
}

// ============================ caching allocator ============================
BOOST_AUTO_TEST_CASE(caching_allocator_reuses_blocks) {
  Tensor a = ones({64, 64});
  Tensor b = full({64, 64}, 2.0);
  { Tensor warm = mul(add(a, b), b); }  // two (64,64) blocks are now cached
  MemoryStats before = memory_stats();
  for (int i = 0; i < 10; ++i) {
    Tensor c = mul(add(a, b), b);
    BOOST_TEST_REQUIRE(c.at({63, 63}) == 6.0);
  }
  MemoryStats after = memory_stats();
  BOOST_TEST(after.allocations - before.allocations == 20u);
  BOOST_TEST(after.system_allocs == before.system_allocs);  // every request served from the cache
  BOOST_TEST(after.cache_hits - before.cache_hits == 20u);
  BOOST_TEST(after.bytes_in_use == before.bytes_in_use);
  BOOST_TEST(after.peak_bytes_in_use >= after.bytes_in_use + 2 * 64 * 64 * 4);
  reset_peak_memory_stats();
  BOOST_TEST(memory_stats().peak_bytes_in_use == memory_stats().bytes_in_use);
  empty_cache();
  BOOST_TEST(memory_stats().bytes_cached == 0u);
  { Tensor fresh = add(a, b); }
  BOOST_TEST(memory_stats().system_allocs == after.system_allocs + 1);
}

// ============================ in-place writes ============================
BOOST_AUTO_TEST_CASE(in_place_writes_bump_the_version) {
  Tensor x = zeros({2, 3}, DType::f64);
  Tensor v = x.t();
  uint64_t v0 = x.version();
  v.copy_(iota({3, 1}));  // broadcast into a transposed view
  BOOST_TEST(values(x) == (std::vector<double>{0, 1, 2, 0, 1, 2}), tt::per_element());
  x.add_(ones({3}, DType::f64), 2.0).mul_(0.5);
  BOOST_TEST(values(x) == (std::vector<double>{1, 1.5, 2, 1, 1.5, 2}), tt::per_element());
  BOOST_TEST(x.version() == v0 + 3);
  BOOST_TEST(v.version() == x.version());  // views share the counter
  Tensor other = iota({2});
  x.set_data(other);
  BOOST_TEST(x.shape() == (Shape{2}));
  BOOST_TEST(same_storage(x, other));
}

// ============================ error paths ============================
BOOST_AUTO_TEST_CASE(error_paths) {
  Tensor x = iota({2, 3});
  check_throws<ShapeError>([] { zeros({2, -1}); }, {"negative", "(2,-1)"});
  check_throws<ShapeError>([] { from_vector(std::vector<double>{1, 2, 3}, {2, 2}); }, {"from_vector", "3", "(2,2)"});
  check_throws<ValueError>([] { arange(0.0, 1.0, 0.0); }, {"arange", "step=0"});
  check_throws<ValueError>([] { randint(3, 3, {2}); }, {"randint", "[3, 3)"});
  check_throws<DTypeError>([] { rand({2}, DType::i64); }, {"rand", "int64"});  // the float dispatcher's error
  check_throws<ShapeError>([] { Shape s{1, 1, 1, 1, 1, 1, 1, 1}; s.push_back(1); }, {"rank"});
  check_throws<DTypeError>([&] { x.data<float>(); }, {"float64", "float32"});
  check_throws<ValueError>([] { Tensor().data<float>(); }, {"undefined"});
  check_throws<ValueError>([] { Tensor().shape(); }, {"undefined"});
  check_throws<ShapeError>([&] { x.item<double>(); }, {"item", "(2,3)", "6"});
  check_throws<IndexError>([&] { x.at({0}); }, {"at", "(2,3)"});
  check_throws<IndexError>([&] { x.at({0, 3}); }, {"index 3", "axis 1", "size 3"});
  check_throws<IndexError>([&] { x.size(2); }, {"size"});
  check_throws<ShapeError>([&] { x.reshape({4, 2}); }, {"reshape", "(2,3)", "(4,2)"});
  check_throws<ShapeError>([&] { x.reshape({-1, -1}); }, {"-1"});
  check_throws<ShapeError>([&] { iota({2, 3, 4}).t(); }, {"t:", "(2,3,4)"});
  check_throws<ShapeError>([&] { x.permute({0}); }, {"permute", "(0)", "(2,3)"});
  check_throws<ShapeError>([&] { x.permute({1, 1}); }, {"permute", "repeated"});
  check_throws<IndexError>([&] { x.transpose(0, 2); }, {"transpose"});
  check_throws<ValueError>([&] { x.slice(0, 0, 2, 0); }, {"slice", "step", "0"});
  check_throws<ShapeError>([] { scalar(1.0).slice(0, 0, 1); }, {"slice", "0-d"});
  check_throws<IndexError>([&] { x.narrow(1, 2, 2); }, {"narrow", "[2, 4)", "size 3"});
  check_throws<IndexError>([&] { x.select(0, 2); }, {"select", "index 2", "size 2"});
  check_throws<ShapeError>([&] { x.expand({3, 3}); }, {"expand", "(2,3)", "(3,3)"});
  check_throws<ShapeError>([&] { x.expand({3}); }, {"expand", "fewer"});
  check_throws<ShapeError>([&] { x.squeeze(0); }, {"squeeze", "size 2"});
  check_throws<IndexError>([&] { x.unsqueeze(4); }, {"unsqueeze", "axis 4"});
  check_throws<ShapeError>([&] { x.copy_(ones({2}, DType::f64)); }, {"copy_", "(2)", "(2,3)"});
  check_throws<ShapeError>([&] { x.select(0, 0).copy_(ones({2, 3})); }, {"copy_", "(2,3)", "into shape (3)"});
  check_throws<DTypeError>([&] { x.add_(ones({2, 3})); }, {"add_", "float32", "float64"});
  check_throws<DTypeError>([] { exp(arange(3)); }, {"exp", "int64"});
  check_throws<DTypeError>([] { rand({2}, DType::i64); }, {"rand", "int64"});
  check_throws<IndexError>([&] { make_view(x, {4, 3}, {3, 1}, 0); }, {"make_view", "(4,3)"});
  check_throws<IndexError>([&] { make_view(x, {2}, {-1}, 0); }, {"make_view"});
  check_throws<ShapeError>([&] { make_view(x, {2}, {1, 1}, 0); }, {"make_view", "rank"});
  BOOST_TEST(make_view(x, {3}, {-1}, 2).at({0}) == 2.0);  // negative strides within bounds are fine
}

BOOST_AUTO_TEST_CASE(integer_tensors) {
  Tensor a = tensor({int64_t{1}, int64_t{5}, int64_t{-3}});
  BOOST_TEST(add(a, a).to_vector<int64_t>() == (std::vector<int64_t>{2, 10, -6}), tt::per_element());
  BOOST_TEST(lt(a, tensor({int64_t{2}, int64_t{2}, int64_t{2}})).to_vector<int64_t>() ==
                 (std::vector<int64_t>{1, 0, 1}),
             tt::per_element());
  BOOST_TEST(a.select(0, 1).item() == 5.0);
  BOOST_TEST(a.select(0, 2).item<int64_t>() == -3);
}
