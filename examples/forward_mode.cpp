// forward_mode — what forward-mode derivatives are for.
//
//   1. sharpness: the top eigenvalues of the Hessian of a small GPT's loss,
//      by Lanczos iterations on tg::hvp (forward over reverse: one H v costs
//      about three gradients), tracked while the model trains; a table, and a
//      plot in <out>/sharpness.png when gnuplot is installed.
//   2. jacobian: the full Jacobian of a network with few inputs and many
//      outputs, by forward mode (one jvp per input: a column each) and by
//      reverse mode (one vjp per output: a row each), timed; the two must
//      agree (exits 1 when they do not).
//
//   build/examples/forward_mode
//   build/examples/forward_mode --part sharpness --steps 600
//   build/examples/forward_mode --quick        # tiny sizes, seconds (the tests)
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "models/gpt.h"
#include "nn/nn.h"
#include "report/report.h"

using namespace tg;

namespace {

struct Config {
  std::string part = "all", out = "out/forward_mode";
  uint64_t seed = 1;
  int threads = 0;
  // sharpness
  int64_t steps = 400, every = 50, lanczos = 16, top = 3, batch = 8, block = 32;
  double lr = 3e-3;
  // jacobian
  int64_t inputs = 4, hidden = 128, outputs = 1024;
  double jacobian_tol = 1e-10;
};

void make_quick(Config& c) {
  c.steps = 20, c.every = 10, c.lanczos = 6, c.batch = 2, c.block = 16;
  c.outputs = 64, c.hidden = 32;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------- 1. sharpness

// A list of tensors (one per parameter) as one vector: dot products and updates.
using Vec = std::vector<Tensor>;
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += sum(mul(a[k], b[k])).item();
  return s;
}
Vec axpy(double alpha, const Vec& x, const Vec& y) {  // alpha x + y
  Vec out;
  for (size_t k = 0; k < x.size(); ++k) out.push_back(add(mul(x[k], alpha), y[k]));
  return out;
}
Vec scaled(const Vec& x, double alpha) {
  Vec out;
  for (const Tensor& t : x) out.push_back(mul(t, alpha));
  return out;
}

// The eigenvalues of a small symmetric matrix (row-major n x n), by cyclic
// Jacobi rotations; largest first.
std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-24) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        if (std::abs(a[p * n + q]) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
        const double t = (theta >= 0 ? 1 : -1) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> ev(n);
  for (int k = 0; k < n; ++k) ev[k] = a[k * n + k];
  std::sort(ev.rbegin(), ev.rend());
  return ev;
}

// The top eigenvalues of the Hessian of loss_fn at params: m Lanczos steps
// (with full reorthogonalisation) from a random start, each one H q by
// tg::hvp; the extreme Ritz values of the tridiagonal matrix converge first.
std::vector<double> top_eigenvalues(const TensorListFn& loss_fn, const Vec& params, int64_t m, Generator& gen) {
  Vec q;
  for (const Tensor& p : params) q.push_back(randn(p.shape(), p.dtype(), &gen));
  q = scaled(q, 1 / std::sqrt(dot(q, q)));
  std::vector<Vec> basis{q};
  std::vector<double> alpha, beta;
  for (int64_t j = 0; j < m; ++j) {
    Vec w = hvp(loss_fn, params, basis.back()).hvp;
    NoGradGuard no_grad;
    alpha.push_back(dot(w, basis.back()));
    for (const Vec& b : basis) w = axpy(-dot(w, b), b, w);  // orthogonal to every earlier q
    const double norm = std::sqrt(dot(w, w));
    if (j + 1 == m || norm < 1e-10) break;
    beta.push_back(norm);
    basis.push_back(scaled(w, 1 / norm));
  }
  const int n = static_cast<int>(alpha.size());
  std::vector<double> t(n * n, 0.0);
  for (int k = 0; k < n; ++k) {
    t[k * n + k] = alpha[k];
    if (k + 1 < n) t[k * n + k + 1] = t[(k + 1) * n + k] = beta[k];
  }
  return symmetric_eigenvalues(t, n);
}

// Character-level text the model learns: the same few sentences, shuffled in windows.
const char* kText =
    "the quick brown fox jumps over the lazy dog. a stitch in time saves nine. "
    "all that glitters is not gold. the early bird catches the worm. ";

void sharpness(const Config& c) {
  const std::string text = kText;
  std::string chars;
  for (char ch : text)
    if (chars.find(ch) == std::string::npos) chars += ch;
  const int64_t V = static_cast<int64_t>(chars.size()), T = c.block;
  std::vector<int64_t> ids;
  for (char ch : text) ids.push_back(static_cast<int64_t>(chars.find(ch)));
  const Tensor corpus = from_vector(ids, {static_cast<int64_t>(ids.size())});
  Generator gen(c.seed);
  // A batch of B windows (B,T) and their next characters.
  auto batch = [&](Generator& g) {
    Tensor start = randint(0, corpus.numel() - T - 1, {c.batch}, &g);
    std::vector<int64_t> x, y;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t s = start.data<int64_t>()[b];
      for (int64_t t = 0; t < T; ++t) {
        x.push_back(ids[static_cast<size_t>(s + t)]);
        y.push_back(ids[static_cast<size_t>(s + t + 1)]);
      }
    }
    return std::pair{from_vector(x, {c.batch, T}), from_vector(y, {c.batch, T})};
  };
  manual_seed(c.seed);
  models::GPT model({.vocab = V, .block = T, .layers = 2, .heads = 2, .dim = 32});
  const Vec params = model.parameters();
  nn::AdamW opt(params, {.lr = c.lr, .weight_decay = 0.0});
  Generator eval_gen(c.seed + 7);
  const auto [ex, ey] = batch(eval_gen);  // the loss whose Hessian is tracked: one fixed batch
  auto eval_loss = [&](const std::vector<Tensor>&) { return std::vector<Tensor>{model.loss(ex, ey)}; };

  fmt::print("1. Sharpness: the top {} Hessian eigenvalues of a GPT's loss ({} parameters, V {}, T {}), by {} Lanczos\n"
             "   steps on tg::hvp (forward over reverse), every {} of {} AdamW steps (lr {}):\n\n",
             c.top, model.num_parameters(), V, T, c.lanczos, c.every, c.steps, c.lr);
  report::Table table{{"step", "train loss", "eval loss"}, {}};
  for (int64_t k = 0; k < c.top; ++k) table.header.push_back(fmt::format("lambda_{}", k + 1));
  table.header.push_back("time");
  std::vector<report::Series> curves(static_cast<size_t>(c.top));
  for (int64_t k = 0; k < c.top; ++k) curves[static_cast<size_t>(k)].name = fmt::format("lambda_{}", k + 1);
  double train_loss = 0;
  for (int64_t step = 0; step <= c.steps; ++step) {
    if (step % c.every == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      Generator lanczos_gen(c.seed + 11);
      const std::vector<double> ev = top_eigenvalues(eval_loss, params, c.lanczos, lanczos_gen);
      double el;
      {
        NoGradGuard no_grad;
        el = model.loss(ex, ey).item();
      }
      std::vector<std::string> row{fmt::format("{}", step), step ? fmt::format("{:.3f}", train_loss) : "-",
                                   fmt::format("{:.3f}", el)};
      for (int64_t k = 0; k < c.top; ++k) {
        const double e = k < static_cast<int64_t>(ev.size()) ? ev[static_cast<size_t>(k)] : NAN;
        row.push_back(fmt::format("{:.3f}", e));
        curves[static_cast<size_t>(k)].x.push_back(static_cast<double>(step));
        curves[static_cast<size_t>(k)].y.push_back(e);
      }
      row.push_back(fmt::format("{:.2f} s", seconds_since(t0)));
      table.rows.push_back(row);
    }
    if (step == c.steps) break;
    const auto [x, y] = batch(gen);
    Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    train_loss = loss.item();
  }
  fmt::print("{}\n", table.text());
  const std::string png = c.out + "/sharpness.png";
  std::filesystem::create_directories(c.out);
  const std::string why = report::plot_lines(png, "Top Hessian eigenvalues during training", "step", "eigenvalue",
                                             curves);
  fmt::print("{}\n\n", why.empty() ? "plot: " + png : "no plot: " + why);
}

// ---------------------------------------------------------------- 2. jacobian

// Returns false when the two Jacobians disagree.
bool jacobian_modes(const Config& c) {
  Generator gen(c.seed + 3);
  const Tensor w1 = mul(randn({c.hidden, c.inputs}, DType::f64, &gen), 1 / std::sqrt(double(c.inputs)));
  const Tensor w2 = mul(randn({c.outputs, c.hidden}, DType::f64, &gen), 1 / std::sqrt(double(c.hidden)));
  const Tensor x = randn({c.inputs}, DType::f64, &gen);
  // f: R^inputs -> R^outputs, tanh MLP.
  const TensorListFn f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh(matmul(w2, tanh(matmul(w1, in[0]))))};
  };
  fmt::print("2. The Jacobian of an MLP {} -> {} -> {} (tanh, float64) at one point:\n\n", c.inputs, c.hidden,
             c.outputs);
  auto t0 = std::chrono::steady_clock::now();
  const Tensor jf = jacobian(f, {x}, {.mode = JacobianMode::forward})[0][0];
  const double t_forward = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const Tensor jr = jacobian(f, {x}, {.mode = JacobianMode::reverse})[0][0];
  const double t_reverse = seconds_since(t0);
  const double diff = max(abs(sub(jf, jr))).item();
  report::Table table{{"mode", "passes", "time", "speedup"}, {}};
  table.rows.push_back({"forward (jacobian, .mode = forward)", fmt::format("{} jvps", c.inputs),
                        fmt::format("{:.2f} ms", t_forward * 1e3), fmt::format("{:.1f}x", t_reverse / t_forward)});
  table.rows.push_back({"reverse (jacobian, .mode = reverse)", fmt::format("{} vjps", c.outputs),
                        fmt::format("{:.2f} ms", t_reverse * 1e3), "1.0x"});
  fmt::print("{}\nmax |J_forward - J_reverse| = {:.2e}: {}\n", table.text(), diff,
             diff <= c.jacobian_tol ? "ok" : "FAILED");
  return diff <= c.jacobian_tol;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  bool quick = false;
  CLI::App app{"forward_mode: Hessian sharpness by Lanczos on forward-over-reverse HVPs; Jacobians in both modes"};
  app.add_option("--part", c.part, "Which part to run")->check(CLI::IsMember({"all", "sharpness", "jacobian"}));
  app.add_flag("--quick", quick, "Tiny sizes, seconds in all (what the tests run); overrides the size options");
  app.add_option("--out", c.out, "Output directory (the sharpness plot)");
  app.add_option("--seed", c.seed, "Seed for initialisation and data");
  app.add_option("--threads", c.threads, "Threads for kernels and OpenBLAS (default: TAPEGRAD_NUM_THREADS or all cores)");
  app.add_option("--steps", c.steps, "Training steps of part 1")->check(CLI::PositiveNumber);
  app.add_option("--every", c.every, "Steps between two eigenvalue estimates")->check(CLI::PositiveNumber);
  app.add_option("--lanczos", c.lanczos, "Lanczos steps (Hessian-vector products) per estimate")->check(CLI::PositiveNumber);
  app.add_option("--outputs", c.outputs, "Outputs of part 2's network")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (quick) make_quick(c);
  try {
    if (c.threads > 0) set_num_threads(c.threads);
    bool ok = true;
    if (c.part == "all" || c.part == "sharpness") sharpness(c);
    if (c.part == "all" || c.part == "jacobian") ok = jacobian_modes(c);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "forward_mode: {}\n", e.what());
    return 1;
  }
}
