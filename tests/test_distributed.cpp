// Data-parallel training over MPI (distributed/, tg::dist): 2 ranks with half a batch each
// take the same 20 steps as one process with the whole batch (GPT and LSTM,
// float64 and float32); different models across ranks are named at start; a
// rank that throws or is killed ends the job within seconds; charlm under
// mpirun prints once, resumes exactly and learns what one process learns.
//
// The same executable is the MPI worker: `test_distributed --worker MODE DIR` runs
// one rank (the test cases start it under mpirun). Built only with MPI.
#define BOOST_TEST_MODULE distributed
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "distributed/ddp.h"
#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "nn/nn.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

constexpr int64_t kVocab = 13, kBatch = 8, kBlock = 8, kSteps = 20;

struct Run {
  std::string kind;  // gpt or lstm
  DType dtype;
  bool overlap = true;
  std::string file() const { return fmt::format("{}_{}{}", kind, dtype_name(dtype), overlap ? "" : "_no_overlap"); }
};
const std::vector<Run> kRuns = {{"gpt", DType::f64}, {"gpt", DType::f32}, {"lstm", DType::f64},
                                {"lstm", DType::f32}, {"gpt", DType::f64, false}};

// GPT without biases: the key bias of attention has a gradient that is zero
// but for rounding (softmax ignores what it adds to every score of a row),
// and Adam, which scales each gradient by its own running size, turns that
// noise into full-size steps that differ with the summation order.
std::shared_ptr<models::LanguageModel> make_model(const std::string& kind, int64_t dim = 16) {
  if (kind == "gpt")
    return std::make_shared<models::GPT>(
        models::GPTOptions{.vocab = kVocab, .block = kBlock, .layers = 2, .heads = 2, .dim = dim, .bias = false});
  return std::make_shared<models::RNNLM>(
      models::RNNLMOptions{.vocab = kVocab, .embed = 8, .hidden = dim, .layers = 1, .cell = models::CellKind::lstm});
}

// Batch `step` of the run, the same on every rank: (B,T) inputs and targets.
std::pair<Tensor, Tensor> batch(int64_t step) {
  Generator g(1000 + static_cast<uint64_t>(step));
  Tensor ids = randint(0, kVocab, {kBatch, kBlock + 1}, &g);
  return {ids.narrow(1, 0, kBlock).contiguous(), ids.narrow(1, 1, kBlock).contiguous()};
}

// Trains `steps` steps of run r with this rank's shard of each batch. Every
// rank starts from its own random weights: only the broadcast makes them
// equal. `before_backward(step)` lets a worker inject a fault.
std::shared_ptr<models::LanguageModel> train(const Run& r, int64_t steps, const std::function<void(int64_t)>& before_backward = {}) {
  manual_seed(100 + static_cast<uint64_t>(dist::rank()));
  auto model = make_model(r.kind);
  model->to(r.dtype);
  std::unique_ptr<nn::Optimizer> opt;
  if (r.kind == "gpt")
    opt = std::make_unique<nn::AdamW>(nn::weight_decay_groups(*model, 0.01), nn::AdamWOptions{.lr = 3e-3});
  else
    opt = std::make_unique<nn::Adam>(model->parameters(), nn::AdamOptions{.lr = 3e-3});
  // Small buckets: several per model, so ordering and overlap are exercised.
  dist::DistributedDataParallel ddp(*model, {.bucket_bytes = 4096, .overlap = r.overlap});
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    opt->zero_grad();
    Tensor loss = model->loss(dist::shard(x), dist::shard(y));
    if (before_backward) before_backward(s);
    loss.backward();
    ddp.finish();
    opt->step();
  }
  return model;
}

// The parameters after the last step and the gradients of that step (the
// optimizer is scale-invariant, so only the gradients show a sum taken for a mean).
std::vector<std::pair<std::string, Tensor>> weights_and_grads(const nn::Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : m.named_parameters()) {
    out.emplace_back(name, p);
    out.emplace_back(name + ".grad", p.grad());
  }
  return out;
}

// A model with a parameter that backward never reaches: its hook never
// fires, so the round stays open until finish(), which averages zeros for it.
struct Partial : nn::Module {
  std::shared_ptr<nn::Linear> used, unused;
  Partial() : Module("Partial") {
    used = register_module("used", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 3, .out = 2}));
    unused = register_module("unused", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 3, .out = 2}));
  }
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// One rank of the job `mode`; DIR receives what the test case reads.
void worker(const std::string& mode, const std::string& dir) {
  set_num_threads(1);
  if (mode == "train") {
    for (const Run& r : kRuns)
      nn::save_tensors(weights_and_grads(*train(r, kSteps)), fmt::format("{}/{}.rank{}.safetensors", dir, r.file(), dist::rank()));
  } else if (mode == "partial") {
    Partial m;
    dist::DistributedDataParallel ddp(m);
    // Rank r's input is all r+1: the mean of the weight gradients is 1.5x rank 0's.
    Tensor x = full({4, 3}, dist::rank() + 1.0);
    sum((*m.used)(x)).backward();
    ddp.finish();
    check(m.unused->weight.grad().defined() && max(abs(m.unused->weight.grad())).item() == 0,
          "the unreached parameter's gradient is zero after finish()");
    check(std::abs(m.used->weight.grad().at({0, 0}) - 4 * 1.5) < 1e-6, "the reached parameter's gradient is the mean");
    // Backward twice without finish(): the second names the misuse.
    sum((*m.used)(x)).backward();
    try {
      sum((*m.used)(x)).backward();
      check(false, "a second backward without finish() throws");
    } catch (const dist::DistError& e) {
      check(std::string(e.what()).find("became final twice") != std::string::npos, e.what());
    }
    ddp.finish();  // closes the round on every rank
    fmt::print("partial ok on rank {}\n", dist::rank());
  } else if (mode == "mismatch") {
    auto model = make_model("gpt", dist::rank() == 1 ? 32 : 16);
    dist::DistributedDataParallel ddp(*model);
  } else if (mode == "throw" || mode == "kill") {
    train(kRuns[1], 1000, [&](int64_t step) {
      if (dist::rank() != 1 || step != 3) return;
      // Wall-clock time of the fault, for the test's "stopped within seconds".
      fmt::print(stderr, "fault at {} ms\n",
                 std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
      if (mode == "kill") std::raise(SIGKILL);
      throw std::runtime_error("injected failure at step 3");
    });
  } else {
    throw std::invalid_argument("unknown worker mode " + mode);
  }
}

// ---- the test cases' side

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

// mpirun for 2 ranks on this machine (however many cores it has), as root
// too (CI), without pinning (the ranks share the cores with everything else)
// and with shared-memory copies that need no ptrace permission (containers).
// In the sanitized build the ranks check addresses and undefined behaviour
// but not leaks: OpenMPI 4.1 keeps what MPI_Init allocates past
// MPI_Finalize, in components it has unloaded by then, so LeakSanitizer can
// neither tell those leaks apart nor be told to ignore them.
std::string mpirun(int ranks = 2) {
  const char* path = std::getenv("MPIRUN");  // meson's find_program
  const char* asan = std::getenv("ASAN_OPTIONS");
  return fmt::format(
      "ASAN_OPTIONS={}detect_leaks=0 {} -np {} --oversubscribe --bind-to none "
      "--mca btl_vader_single_copy_mechanism none{}",
      asan && *asan ? std::string(asan) + ":" : "", path && *path ? path : "mpirun", ranks,
      ::geteuid() == 0 ? " --allow-run-as-root" : "");
}

struct Outcome {
  int status = -1;
  std::string output;
  int64_t end_ms = 0;  // wall clock when it ended
};

Outcome run(const std::string& cmd) {
  testing::TempDir tmp;
  const std::string log = tmp / "log";
  const int rc = std::system(fmt::format("{} >'{}' 2>&1", cmd, log).c_str());
  Outcome o;
  o.end_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream f(log);
  std::stringstream s;
  s << f.rdbuf();
  o.output = s.str();
  BOOST_TEST_MESSAGE(cmd << " -> " << o.status << "\n" << o.output);
  return o;
}

// Milliseconds from the worker's "fault at" line to the end of mpirun. A job
// that does not end hangs for good (the other rank waits in its allreduce
// forever); one that ends takes about a second on an idle machine and has
// taken 24 s with the rest of the suite running on its 2 cores. The bound
// below tells the two apart without timing the machine.
constexpr int64_t kEndsMs = 120'000;
int64_t stop_delay_ms(const Outcome& o) {
  const size_t at = o.output.find("fault at ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, "the worker never reached its fault:\n" << o.output);
  return o.end_ms - std::stoll(o.output.substr(at + 9));
}

std::string env(const char* var) {
  const char* p = std::getenv(var);
  BOOST_REQUIRE_MESSAGE(p && *p, var << " is not set (run the tests through meson)");
  return p;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_ranks_with_half_batches_take_the_steps_of_one_with_the_whole_batch) {
  testing::TempDir dir;
  Outcome o = run(fmt::format("{} {} --worker train {}", mpirun(), self_exe(), dir.path.string()));
  BOOST_REQUIRE_MESSAGE(o.status == 0, o.output);
  for (const Run& r : kRuns) {
    auto want = weights_and_grads(*train(r, kSteps));  // this process is a world of one: the whole batch
    // Summation order differs (two half-batch sums, then their mean), nothing else.
    testing::Parity parity{r.dtype == DType::f64 ? 1e-12 : 1e-5};
    for (int rank = 0; rank < 2; ++rank) {
      nn::TensorFile got = nn::load_tensors(fmt::format("{}/{}.rank{}.safetensors", dir.path.string(), r.file(), rank));
      BOOST_REQUIRE_EQUAL(got.tensors.size(), want.size());
      for (auto& [name, t] : want) parity.check(fmt::format("{} rank {} {}", r.file(), rank, name), got.at(name), t);
    }
    BOOST_TEST_MESSAGE(r.file() << ": worst relative difference " << parity.worst);
    // The runs really moved the weights (a comparison of untrained models would prove nothing).
    manual_seed(100);  // rank 0's start, which train() began from
    auto start = make_model(r.kind);
    start->to(r.dtype);
    BOOST_TEST(testing::rel_error(start->named_parameters()[0].second, want[0].second) > 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_backward_never_reaches_is_averaged_by_finish) {
  testing::TempDir dir;
  Outcome o = run(fmt::format("{} {} --worker partial {}", mpirun(), self_exe(), dir.path.string()));
  BOOST_TEST(o.status == 0);
  BOOST_TEST(o.output.find("partial ok on rank 0") != std::string::npos);
  BOOST_TEST(o.output.find("partial ok on rank 1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(different_models_across_ranks_are_named_at_start) {
  testing::TempDir dir;
  Outcome o = run(fmt::format("{} {} --worker mismatch {}", mpirun(), self_exe(), dir.path.string()));
  BOOST_TEST(o.status != 0);
  BOOST_TEST(o.output.find("the models differ between ranks: rank 1 has 'parameter wte.weight (13,32) float32' "
                           "where rank 0 has 'parameter wte.weight (13,16) float32'") != std::string::npos,
             o.output);
}

BOOST_AUTO_TEST_CASE(a_rank_that_throws_ends_the_job_within_seconds) {
  testing::TempDir dir;
  Outcome o = run(fmt::format("{} {} --worker throw {}", mpirun(), self_exe(), dir.path.string()));
  BOOST_TEST(o.status != 0);
  BOOST_TEST(o.output.find("[rank 1/2] test_distributed worker: injected failure at step 3") != std::string::npos, o.output);
  const int64_t delay = stop_delay_ms(o);
  BOOST_TEST_MESSAGE("stopped " << delay << " ms after the exception");
  BOOST_TEST(delay < kEndsMs);
}

BOOST_AUTO_TEST_CASE(a_rank_killed_by_a_signal_ends_the_job_within_seconds) {
  testing::TempDir dir;
  Outcome o = run(fmt::format("{} {} --worker kill {}", mpirun(), self_exe(), dir.path.string()));
  BOOST_TEST(o.status != 0);
  BOOST_TEST(o.output.find("signal 9") != std::string::npos, o.output);
  const int64_t delay = stop_delay_ms(o);
  BOOST_TEST_MESSAGE("stopped " << delay << " ms after the kill");
  BOOST_TEST(delay < kEndsMs);
}

BOOST_AUTO_TEST_CASE(charlm_under_mpirun_prints_once_resumes_exactly_and_matches_one_process) {
  const std::string charlm = env("CHARLM");
  const std::string tiny = " --data tests/fixtures/tiny.txt --models gpt,lstm --steps 20 --batch 8 --block 16 --eval-every 10"
                           " --eval-batches 2 --gpt-dim 16 --gpt-layers 1 --gpt-heads 2 --embed 8 --sample-len 10"
                           " --threads 1 --warmup 5 --lr 1e-2";
  testing::TempDir whole, resumed, single;
  Outcome a = run(fmt::format("{} {} {} --out {}", mpirun(), charlm, tiny, whole.path.string()));
  BOOST_REQUIRE_MESSAGE(a.status == 0, a.output);
  // Rank 0 alone prints: one header, one table.
  size_t headers = 0;
  for (size_t p = a.output.find("charlm: "); p != std::string::npos; p = a.output.find("charlm: ", p + 1)) ++headers;
  BOOST_TEST(headers == 2u, a.output);  // the corpus line and the budget line
  BOOST_TEST(a.output.find("2 ranks") != std::string::npos, a.output);

  Outcome b1 = run(fmt::format("{} {} {} --stop-after 10 --out {}", mpirun(), charlm, tiny, resumed.path.string()));
  BOOST_REQUIRE_MESSAGE(b1.status == 0, b1.output);
  Outcome b2 = run(fmt::format("{} {} {} --resume --out {}", mpirun(), charlm, tiny, resumed.path.string()));
  BOOST_REQUIRE_MESSAGE(b2.status == 0, b2.output);
  BOOST_TEST(b2.output.find("resumed at step 10") != std::string::npos, b2.output);
  // Same ranks, same order of every sum: the resumed run is the uninterrupted one.
  BOOST_TEST(read(resumed.path / "loss.csv") == read(whole.path / "loss.csv"));

  Outcome c = run(fmt::format("{} {} --out {}", charlm, tiny, single.path.string()));
  BOOST_REQUIRE_MESSAGE(c.status == 0, c.output);
  // One process with the whole batch: the same curve up to float32 summation order.
  std::istringstream x(read(whole.path / "loss.csv")), y(read(single.path / "loss.csv"));
  std::string lx, ly;
  int rows = 0;
  while (std::getline(x, lx) && std::getline(y, ly)) {
    if (rows++ == 0) continue;  // header
    std::vector<double> vx, vy;
    std::stringstream sx(lx), sy(ly);
    for (std::string f; std::getline(sx, f, ',');) vx.push_back(f[0] >= 'a' ? 0 : std::stod(f));
    for (std::string f; std::getline(sy, f, ',');) vy.push_back(f[0] >= 'a' ? 0 : std::stod(f));
    BOOST_REQUIRE_EQUAL(vx.size(), vy.size());
    for (size_t k = 3; k < vx.size(); ++k)
      BOOST_TEST(std::abs(vx[k] - vy[k]) <= 1e-4 * std::abs(vy[k]), "row " << rows << ": " << lx << " vs " << ly);
  }
  BOOST_TEST(rows == 5);  // header, 2 models x 2 evaluations
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--worker") {
    dist::Environment env(argc, argv);
    try {
      worker(argv[2], argv[3]);
    } catch (const std::exception& e) {
      dist::abort(fmt::format("test_distributed worker: {}", e.what()));
    }
    return 0;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
