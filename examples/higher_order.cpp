// higher_order — gradients of gradients: tg::grad(..., {.create_graph = true})
// records the backward pass, so a gradient can be differentiated again.
//
//   1. hvp:     a Hessian-vector product of an MLP's loss by double backward,
//               H v = d(grad . v)/dp, checked against central differences of
//               gradients in float64 (exits 1 when they disagree);
//   2. maml:    MAML on sine-wave regression (Finn et al. 2017): the outer
//               loss is differentiated through the inner SGD steps, compared
//               with first-order MAML and with plain pre-training;
//   3. penalty: double backprop (Drucker & LeCun 1992; the gradient penalty of
//               WGAN-GP): training with a penalty on the input gradient's
//               norm, against the same training without it.
//
//   build/examples/higher_order                  # all three parts
//   build/examples/higher_order --part maml --meta-iters 4000
//   build/examples/higher_order --quick          # tiny sizes, seconds (the tests)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

using namespace tg;

namespace {

struct Config {
  std::string part = "all";
  uint64_t seed = 1;
  int threads = 0;
  // hvp
  double hvp_eps = 1e-5, hvp_tol = 1e-6;
  int64_t hvp_directions = 3;
  // maml
  int64_t meta_iters = 8000, meta_batch = 10, shots = 10, queries = 10, inner_steps = 1, eval_steps = 10;
  int64_t eval_tasks = 100, eval_points = 100;
  double inner_lr = 0.01, outer_lr = 1e-3;
  // penalty
  int64_t penalty_steps = 600, penalty_points = 64;
  double penalty = 0.3;
};

// Sets the sizes to seconds' worth of work (what the tests run).
void make_quick(Config& c) {
  c.meta_iters = 20, c.meta_batch = 4, c.eval_tasks = 8, c.eval_steps = 3, c.eval_points = 20;
  c.penalty_steps = 30;
}

// An MLP's parameters in forward order (w1, b1, w2, b2, ...) as a plain
// list, so that the forward can run with any list of that shape: the
// module's own parameters, or adapted ones that are functions of them.
using Params = std::vector<Tensor>;

enum class Act { relu, tanh };

// x (N, in) -> (N, out): linear, act, linear, act, ..., linear.
Tensor mlp(const Params& p, const Tensor& x, Act act) {
  Tensor h = x;
  for (size_t l = 0; l + 2 < p.size(); l += 2) {
    h = linear(h, p[l], p[l + 1]);
    h = act == Act::relu ? relu(h) : tanh(h);
  }
  return linear(h, p[p.size() - 2], p.back());
}

// The same MLP as a module: it owns (and initialises) the parameters.
struct MLP : nn::Module {
  Act act;
  MLP(const std::vector<int64_t>& sizes, Act a) : Module("MLP"), act(a) {
    for (size_t i = 0; i + 1 < sizes.size(); ++i)
      register_module(fmt::format("fc{}", i + 1),
                      std::make_shared<nn::Linear>(nn::LinearOptions{.in = sizes[i], .out = sizes[i + 1]}));
  }
  Tensor forward(const Tensor& x) const { return mlp(parameters(), x, act); }
};

// sum_i <a_i, b_i>: a scalar (differentiable in both lists).
Tensor dot(const Params& a, const Params& b) {
  Tensor s = sum(mul(a[0], b[0]));
  for (size_t i = 1; i < a.size(); ++i) s = add(s, sum(mul(a[i], b[i])));
  return s;
}

// ---------------------------------------------------------------- 1. hvp

// H v by double backward against (grad(p + eps v) - grad(p - eps v)) / (2 eps),
// for a few random directions v. Returns the largest relative difference
// max |Hv - fd| / max |Hv|.
double hvp_check(const Config& c) {
  manual_seed(c.seed);
  MLP net({3, 16, 16, 2}, Act::tanh);
  net.to(DType::f64);
  Generator gen(c.seed);
  const Tensor x = randn({32, 3}, DType::f64, &gen), y = randn({32, 2}, DType::f64, &gen);
  const Params p = net.parameters();
  auto loss = [&] { return nn::mse_loss(net.forward(x), y); };
  Params p0;
  for (const Tensor& t : p) p0.push_back(t.detach().clone());
  // Gradients at p0 + s v (the parameters are restored from p0 afterwards).
  auto grad_at = [&](const Params& v, double s) {
    {
      NoGradGuard no_grad;
      for (size_t i = 0; i < p.size(); ++i) p[i].copy_(add(p0[i], mul(v[i], s)));
    }
    Params g = tg::grad({loss()}, p);
    NoGradGuard no_grad;
    for (size_t i = 0; i < p.size(); ++i) p[i].copy_(p0[i]);
    return g;
  };

  fmt::print("1. Hessian-vector product by double backward: MLP 3-16-16-2 tanh, {} parameters, MSE on 32 points,"
             " float64\n",
             net.num_parameters());
  double worst = 0;
  for (int64_t d = 0; d < c.hvp_directions; ++d) {
    Params v;
    for (const Tensor& t : p) v.push_back(randn(t.shape(), DType::f64, &gen));
    // grad(loss) recorded (and its graph kept for the second pass), then
    // grad(grad . v): one backward of a backward.
    Params g = tg::grad({loss()}, p, {}, {.retain_graph = true, .create_graph = true});
    Params hv = tg::grad({dot(g, v)}, p);
    Params gp = grad_at(v, c.hvp_eps), gm = grad_at(v, -c.hvp_eps);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      Tensor fd = mul(sub(gp[i], gm[i]), 0.5 / c.hvp_eps);
      diff = std::max(diff, max(abs(sub(hv[i], fd))).item());
      scale = std::max(scale, max(abs(hv[i])).item());
    }
    const double rel = diff / scale;
    fmt::print("   direction {}: max |Hv| {:.4f}, max |Hv - finite difference| {:.2e}, relative {:.2e}\n", d + 1, scale,
               diff, rel);
    worst = std::max(worst, rel);
  }
  fmt::print("hvp check: max relative difference {:.2e} over {} directions (eps {:.0e}, tolerance {:.0e}): {}\n\n",
             worst, c.hvp_directions, c.hvp_eps, c.hvp_tol, worst <= c.hvp_tol ? "ok" : "FAILED");
  return worst;
}

// ---------------------------------------------------------------- 2. maml

// y = A sin(x + phi), A in [0.1, 5], phi in [0, pi], x in [-5, 5].
struct SineTask {
  double amp, phase;
};

SineTask sample_task(Generator& g) {
  const double amp = 0.1 + 4.9 * g.uniform();
  return {amp, std::numbers::pi * g.uniform()};
}

// n points of a task: x (n, 1), y (n, 1), float32.
std::pair<Tensor, Tensor> sample_points(const SineTask& t, int64_t n, Generator& g) {
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(-5.0 + 10.0 * g.uniform());
    y[i] = static_cast<float>(t.amp * std::sin(x[i] + t.phase));
  }
  return {from_vector(x, {n, 1}), from_vector(y, {n, 1})};
}

Tensor sine_net(const Params& p, const Tensor& x) { return mlp(p, x, Act::relu); }

// `steps` SGD steps on the support set, from p. With create_graph the inner
// gradients are recorded, so the adapted parameters are differentiable
// functions of p through the steps (MAML); without, each inner gradient is a
// constant and d adapted / d p is the identity (first-order MAML).
Params adapt(const Params& p, const Tensor& xs, const Tensor& ys, int64_t steps, double lr, bool create_graph) {
  Params a = p;
  for (int64_t s = 0; s < steps; ++s) {
    Params g = tg::grad({nn::mse_loss(sine_net(a, xs), ys)}, a, {},
                        {.retain_graph = create_graph, .create_graph = create_graph});
    for (size_t i = 0; i < a.size(); ++i) a[i] = sub(a[i], mul(g[i], lr));
  }
  return a;
}

enum class Method { maml, first_order, pretrain };

const char* method_name(Method m) {
  return m == Method::maml ? "MAML" : m == Method::first_order ? "first-order MAML" : "pre-training";
}

// Trains a 1-40-40-1 ReLU net with Adam for meta_iters steps of meta_batch
// tasks each. Every method starts from the same initialisation and sees the
// same tasks and points (K support + queries per task).
Params train_sine(Method m, const Config& c) {
  manual_seed(c.seed);
  MLP net({1, 40, 40, 1}, Act::relu);
  const Params p = net.parameters();
  nn::Adam opt(p, {.lr = c.outer_lr});
  Generator gen(c.seed + 1);
  report::Progress bar(m == Method::maml ? "maml" : m == Method::first_order ? "fomaml" : "pretrain", c.meta_iters,
                         "tasks");
  double shown = 0;
  for (int64_t it = 0; it < c.meta_iters; ++it) {
    Tensor total;
    for (int64_t t = 0; t < c.meta_batch; ++t) {
      const SineTask task = sample_task(gen);
      auto [xs, ys] = sample_points(task, c.shots, gen);
      auto [xq, yq] = sample_points(task, c.queries, gen);
      Tensor l = m == Method::pretrain
                     ? nn::mse_loss(sine_net(p, concat({xs, xq}, 0)), concat({ys, yq}, 0))
                     : nn::mse_loss(sine_net(adapt(p, xs, ys, c.inner_steps, c.inner_lr, m == Method::maml), xq), yq);
      total = total.defined() ? add(total, l) : l;
    }
    Tensor loss = mul(total, 1.0 / c.meta_batch);
    loss.backward();  // MAML: through the inner steps' recorded gradients, to p
    opt.step();
    opt.zero_grad();
    shown = it == 0 ? loss.item() : 0.98 * shown + 0.02 * loss.item();
    bar.update(it + 1, static_cast<double>((it + 1) * c.meta_batch), fmt::format("loss {:.3f}", shown));
  }
  bar.finish(fmt::format("loss {:.3f}", shown));
  return p;
}

struct AdaptResult {
  double before = 0, after_one = 0, after_k = 0;
};

// Mean query MSE over held-out tasks (the same for every method) before
// adaptation and after 1 and after eval_steps SGD steps on K support points.
AdaptResult evaluate_sine(const Params& p, const Config& c) {
  Generator gen(c.seed + 1000);
  AdaptResult r;
  for (int64_t t = 0; t < c.eval_tasks; ++t) {
    const SineTask task = sample_task(gen);
    auto [xs, ys] = sample_points(task, c.shots, gen);
    auto [xq, yq] = sample_points(task, c.eval_points, gen);
    auto query_mse = [&](const Params& a) {
      NoGradGuard no_grad;
      return nn::mse_loss(sine_net(a, xq), yq).item();
    };
    Params a = p;
    r.before += query_mse(a);
    for (int64_t s = 1; s <= c.eval_steps; ++s) {
      a = adapt(a, xs, ys, 1, c.inner_lr, false);
      if (s == 1) r.after_one += query_mse(a);
      if (s == c.eval_steps) r.after_k += query_mse(a);
    }
  }
  r.before /= c.eval_tasks, r.after_one /= c.eval_tasks, r.after_k /= c.eval_tasks;
  return r;
}

void maml(const Config& c) {
  fmt::print("2. MAML on sine waves y = A sin(x + phi): MLP 1-40-40-1 ReLU, K = {} support / {} query points,\n"
             "   {} inner SGD step{} (lr {}), {} meta-iterations x {} tasks, Adam lr {}\n",
             c.shots, c.queries, c.inner_steps, c.inner_steps > 1 ? "s" : "", c.inner_lr, c.meta_iters, c.meta_batch,
             c.outer_lr);
  report::Table table{{"method", "before adaptation", "after 1 step", fmt::format("after {} steps", c.eval_steps),
                         "train time"},
                        {}};
  for (Method m : {Method::maml, Method::first_order, Method::pretrain}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Params p = train_sine(m, c);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const AdaptResult r = evaluate_sine(p, c);
    table.rows.push_back({method_name(m), fmt::format("{:.3f}", r.before), fmt::format("{:.3f}", r.after_one),
                          fmt::format("{:.3f}", r.after_k), report::format_duration(seconds)});
  }
  fmt::print("\n{}\nquery MSE averaged over {} held-out tasks ({} query points each), adapted by SGD (lr {}) on K = {} "
             "support points\n\n",
             table.text(), c.eval_tasks, c.eval_points, c.inner_lr, c.shots);
}

// ---------------------------------------------------------------- 3. penalty

// Two interleaved half circles with noise, labels 0/1: x (n, 2), y (n, 1).
std::pair<Tensor, Tensor> two_moons(int64_t n, double noise, Generator& g) {
  std::vector<float> x(2 * n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(i % 2);
    const double t = std::numbers::pi * g.uniform();
    x[2 * i] = static_cast<float>((label ? 1.0 - std::cos(t) : std::cos(t)) + noise * g.normal());
    x[2 * i + 1] = static_cast<float>((label ? 0.5 - std::sin(t) : std::sin(t)) + noise * g.normal());
    y[i] = static_cast<float>(label);
  }
  return {from_vector(x, {n, 2}), from_vector(y, {n, 1})};
}

// d f / d x for every row of x (rows are independent, so the gradient of
// sum(f) holds each row's own input gradient): (N, 2).
Tensor input_gradient(const Params& p, const Tensor& x, bool create_graph) {
  Tensor xi = x.detach().requires_grad_();
  return tg::grad({sum(mlp(p, xi, Act::tanh))}, {xi}, {},
                  {.retain_graph = create_graph, .create_graph = create_graph})[0];
}

// Mean of |d f / d x| over the rows of x.
double gradient_norm(const Params& p, const Tensor& x) {
  return mean(sqrt(sum(pow(input_gradient(p, x, false), 2.0), {1}))).item();
}

double accuracy(const Params& p, const Tensor& x, const Tensor& y) {
  NoGradGuard no_grad;
  Tensor right = eq(gt(mlp(p, x, Act::tanh), zeros({1})), y.to(DType::i64));
  return 100.0 * mean(right.to(DType::f32)).item();
}

void penalty(const Config& c) {
  Generator gen(c.seed + 2);
  auto [x, y] = two_moons(c.penalty_points, 0.25, gen);
  auto [xt, yt] = two_moons(1000, 0.25, gen);
  fmt::print("3. Input-gradient penalty (double backprop): two moons, {} noisy training points, MLP 2-64-64-1 tanh,\n"
             "   {} full-batch Adam steps; loss = BCE + lambda * mean |d logit / d x|^2, lambda {}\n",
             c.penalty_points, c.penalty_steps, c.penalty);
  std::vector<std::vector<double>> curves(2);
  report::Table table{
      {"lambda", "train BCE", "train acc", "test acc", "mean |df/dx| train", "mean |df/dx| test"}, {}};
  std::vector<int64_t> marks;
  for (double lambda : {0.0, c.penalty}) {
    manual_seed(c.seed);
    MLP net({2, 64, 64, 1}, Act::tanh);
    const Params p = net.parameters();
    nn::Adam opt(p, {.lr = 1e-2});
    double bce = 0;
    for (int64_t step = 0; step < c.penalty_steps; ++step) {
      Tensor data_loss = nn::binary_cross_entropy_with_logits(net.forward(x), y);
      Tensor loss = data_loss;
      if (lambda > 0) {
        // The input gradient is recorded (create_graph), so its norm is a
        // differentiable function of the parameters: backward goes through it.
        Tensor gx = input_gradient(p, x, true);
        loss = add(loss, mul(mean(sum(mul(gx, gx), {1})), lambda));
      }
      loss.backward();
      opt.step();
      opt.zero_grad();
      bce = data_loss.item();
      if ((step + 1) % std::max<int64_t>(1, c.penalty_steps / 5) == 0) {
        if (lambda == 0) marks.push_back(step + 1);
        curves[lambda > 0].push_back(gradient_norm(p, xt));
      }
    }
    table.rows.push_back({fmt::format("{}", lambda), fmt::format("{:.3f}", bce),
                          fmt::format("{:.1f}%", accuracy(p, x, y)), fmt::format("{:.1f}%", accuracy(p, xt, yt)),
                          fmt::format("{:.3f}", gradient_norm(p, x)), fmt::format("{:.3f}", gradient_norm(p, xt))});
  }
  report::Table during{{"step", "mean |df/dx|, lambda 0", fmt::format("mean |df/dx|, lambda {}", c.penalty)}, {}};
  for (size_t i = 0; i < marks.size(); ++i)
    during.rows.push_back({fmt::format("{}", marks[i]), fmt::format("{:.3f}", curves[0][i]),
                           fmt::format("{:.3f}", curves[1][i])});
  fmt::print("\n{}\ninput-gradient norms during training (1000 test points):\n{}\n", table.text(), during.text());
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  bool quick = false;
  CLI::App app{"higher_order: Hessian-vector products, MAML and gradient penalties by differentiating gradients"};
  app.add_option("--part", c.part, "Which part to run")->check(CLI::IsMember({"all", "hvp", "maml", "penalty"}));
  app.add_flag("--quick", quick, "Tiny sizes, seconds in all (what the tests run); overrides the size options");
  app.add_option("--seed", c.seed, "Seed for initialisation, tasks and data");
  app.add_option("--threads", c.threads,
                 "Threads for kernels and OpenBLAS (default: TAPEGRAD_NUM_THREADS or all cores)");
  app.add_option("--hvp-tol", c.hvp_tol, "Largest relative difference between double backward and finite differences");
  app.add_option("--meta-iters", c.meta_iters, "Outer (Adam) steps of each method")->check(CLI::PositiveNumber);
  app.add_option("--meta-batch", c.meta_batch, "Tasks per outer step")->check(CLI::PositiveNumber);
  app.add_option("--shots", c.shots, "Support points per task (K)")->check(CLI::PositiveNumber);
  app.add_option("--inner-steps", c.inner_steps, "Inner SGD steps during meta-training")->check(CLI::PositiveNumber);
  app.add_option("--inner-lr", c.inner_lr, "Inner SGD learning rate (also at evaluation)");
  app.add_option("--outer-lr", c.outer_lr, "Outer Adam learning rate");
  app.add_option("--eval-steps", c.eval_steps, "Inner SGD steps at evaluation (k)")->check(CLI::PositiveNumber);
  app.add_option("--eval-tasks", c.eval_tasks, "Held-out tasks to evaluate on")->check(CLI::PositiveNumber);
  app.add_option("--penalty", c.penalty, "Weight (lambda) of the input-gradient penalty");
  app.add_option("--penalty-steps", c.penalty_steps, "Training steps of part 3")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (quick) make_quick(c);

  try {
    if (c.threads > 0) set_num_threads(c.threads);
    bool ok = true;
    if (c.part == "all" || c.part == "hvp") ok = hvp_check(c) <= c.hvp_tol;
    if (c.part == "all" || c.part == "maml") maml(c);
    if (c.part == "all" || c.part == "penalty") penalty(c);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "higher_order: {}\n", e.what());
    return 1;
  }
}
