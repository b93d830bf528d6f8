// Faults injected into a training step and into a checkpoint save, one at a
// time, every one of them (autograd/fault.h), as SQLite's tests do.
//
// Allocations: one training step (zero_grad, loss, backward, gradient
// clipping, AdamW) of a tiny GPT and a tiny LSTM LM, plain, under bf16
// autocast, with activation checkpointing and with a forward-over-reverse
// hvp in its update, at 1 and 2 kernel threads. The step is first run
// undisturbed, counting its allocations; then, for every n below that count,
// a fresh copy of the model runs it with the n-th allocation failing. Each
// must:
//   - raise OutOfMemoryError, within a time limit (a watchdog aborts a hang);
//   - leave the parameters and the optimizer state exactly as before the
//     step or exactly as after it, never between;
//   - give back every byte of tensor memory it took (and, in the ASan build,
//     leak nothing else);
//   - be followed by a step that, undisturbed, gives the undisturbed run's
//     loss, parameters and state, bit for bit.
// The step sweeps the first step of the run: it is the one that also
// allocates the optimizer's state.
//
// I/O: a model's and an optimizer's (with its training state) checkpoint
// saved over an older one, with each open, write, fsync, close and rename of
// the writer failing in turn (EIO, and ENOSPC for a full disk). Each must name
// the file and the errno, leave no temporary file, and leave the older
// checkpoint in place bit for bit — or, where the failing call came after
// the rename (the directory's fsync), the new one. A file cut short at any
// byte is refused with a reason.
//
// The counts tried are printed (--log_level=message): doc/testing.md quotes them.
#define BOOST_TEST_MODULE faults
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/fault.h"
#include "autograd/forward_ad.h"
#include "autograd/parallel.h"
#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "models/training_state.h"
#include "models/word2vec.h"
#include "nn/checkpoint.h"
#include "nn/optim.h"
#include "tests/testing.h"

using namespace tg;
using detail::AllocationFaults;
using detail::IoCall;
using detail::IoFaults;

namespace {

constexpr int64_t kT = 6;
// At 1 thread the smallest models and batch; at 2 threads, what it takes
// for the pool to split some of the step's work (checked): GPT's GEMMs split
// from ~2^18 multiply-adds, the LSTM's gates over a batch of 32.
// GPT has one block at 2 threads: the block's every op runs split, and the
// sweep, whose cost grows as allocations times step time, stays within a
// sanitized CI's minutes.
struct Size {
  int64_t batch, dim, layers;
};
Size size_for(const std::string& model, int threads) {
  if (threads == 1) return {2, 8, 2};
  return model == "gpt" ? Size{16, 32, 1} : Size{32, 8, 2};
}

// Aborts the process with a message if not destroyed within `limit`: a hang
// fails the test instead of stalling CI.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit)
      : thread_([this, what = std::move(what), limit] {
          std::unique_lock lock(mu_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "test_faults: %s did not return within %lld s: a hang\n", what.c_str(),
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

struct Config {
  std::string name;
  bool autocast = false, checkpoint = false, hvp = false;
};
const Config kConfigs[] = {{.name = "plain"},
                           {.name = "autocast_bf16", .autocast = true},
                           {.name = "checkpoint", .checkpoint = true},
                           {.name = "hvp", .hvp = true}};

// A model, its batch and its optimizer, the same for the same arguments.
struct Run {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor()> loss;
  std::unique_ptr<nn::Optimizer> opt;
  std::vector<Tensor> params, v;  // v: the direction of the hvp step
};

Run make_run(const std::string& model, const Config& c, int threads = 1) {
  const auto [B, dim, layers] = size_for(model, threads);
  manual_seed(5);
  Run r;
  Generator g(9);
  const Tensor x = randint(0, 11, {B, kT}, &g), y = randint(0, 11, {B, kT}, &g);
  if (model == "gpt") {
    auto m = std::make_shared<models::GPT>(models::GPTOptions{
        .vocab = 11, .block = kT, .layers = layers, .heads = 2, .dim = dim, .dropout = 0.1,
        .checkpoint_blocks = c.checkpoint ? 1 : 0});
    r.module = m;
    r.loss = [m, x, y] { return m->loss(x, y); };
  } else {
    auto m = std::make_shared<models::RNNLM>(models::RNNLMOptions{
        .vocab = 11, .embed = 6, .hidden = 32, .layers = layers, .cell = models::CellKind::lstm, .dropout = 0.1,
        .checkpoint_time = c.checkpoint});
    r.module = m;
    r.loss = [m, x, y] { return m->loss(x, y); };
  }
  r.params = r.module->parameters();
  for (const Tensor& p : r.params) r.v.push_back(randn(p.shape(), p.dtype(), &g));
  r.opt = std::make_unique<nn::AdamW>(r.params, nn::AdamWOptions{.lr = 1e-2});
  return r;
}

// One training step, as lm_train takes it; with hvp, the update follows
// grad + 0.01 H v. Returns the loss.
double step(Run& r, const Config& c) {
  manual_seed(17);  // the dropout masks
  r.opt->zero_grad();
  std::optional<AutocastGuard> autocast;
  if (c.autocast) autocast.emplace(DType::bf16);
  double loss = 0;
  if (c.hvp) {
    const HvpResult h = hvp([&](const std::vector<Tensor>&) { return std::vector<Tensor>{r.loss()}; }, r.params, r.v);
    loss = h.value.item();
    for (size_t i = 0; i < r.params.size(); ++i) r.params[i].set_grad(h.grads[i] + 0.01 * h.hvp[i]);
  } else {
    const Tensor l = r.loss();
    l.backward();
    loss = l.item();
  }
  nn::clip_grad_norm_(r.params, 1.0);
  r.opt->step();
  return loss;
}

// The parameters and the optimizer's state, as bytes.
using State = std::vector<std::pair<std::string, std::vector<double>>>;
State state_of(const Run& r) {
  State s;
  for (auto& [name, p] : r.module->named_parameters()) s.emplace_back(name, p.to(DType::f64).to_vector<double>());
  for (auto& [name, t] : r.opt->state_dict()) s.emplace_back("opt." + name, t.to(DType::f64).to_vector<double>());
  return s;
}
bool bitwise_equal(const State& a, const State& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].first != b[k].first || a[k].second.size() != b[k].second.size()) return false;
    if (std::memcmp(a[k].second.data(), b[k].second.data(), a[k].second.size() * sizeof(double)) != 0) return false;
  }
  return true;
}

struct SweepCounts {
  int64_t sites = 0, leaks = 0, half_updated = 0;
};
SweepCounts total_sweep;

void sweep(const std::string& model, const Config& c, int threads) {
  set_num_threads(threads);
  const std::string what = fmt::format("{} {} at {} thread(s)", model, c.name, threads);
  const auto start = std::chrono::steady_clock::now();

  // A first step makes what a process makes once (kernel threads, oneDNN's
  // primitives): the count below is then that of every later run.
  {
    Run warm = make_run(model, c, threads);
    step(warm, c);
  }
  // The undisturbed run: its allocations, losses and states.
  Run ref = make_run(model, c, threads);
  const State before = state_of(ref);
  int64_t count = 0;
  double loss1 = 0;
  const int64_t jobs = detail::pool_jobs();
  {
    AllocationFaults counter;
    loss1 = step(ref, c);
    count = counter.count();
  }
  if (threads > 1) BOOST_TEST(detail::pool_jobs() > jobs, what << ": the pool split none of the step's work");
  const State after = state_of(ref);
  const double loss2 = step(ref, c);
  const State after2 = state_of(ref);
  BOOST_REQUIRE_MESSAGE(count > 0, what << ": the step allocated nothing");

  int64_t failures = 0;
  for (int64_t n = 0; n < count; ++n) {
    Run r = make_run(model, c, threads);
    const size_t in_use = memory_stats().bytes_in_use;
    bool raised = false, fired = false;
    std::string error;
    {
      Watchdog dog(fmt::format("{}, allocation {} failing", what, n), std::chrono::seconds(120));
      AllocationFaults fault(n);
      try {
        step(r, c);
      } catch (const OutOfMemoryError& e) {
        raised = true;
        error = e.what();
        if (std::string(e.what()).find("out of memory") == std::string::npos) ++failures;
      }
      fired = fault.fired();
    }
    BOOST_TEST_CONTEXT(what << ", allocation " << n << " of " << count) {
      BOOST_TEST(fired);
      BOOST_TEST(raised);
      const State now = state_of(r);
      const bool was_before = bitwise_equal(now, before), was_after = bitwise_equal(now, after);
      BOOST_TEST((was_before || was_after), "half-updated: neither the state before the step nor after it");
      if (!was_before && !was_after) ++total_sweep.half_updated;
      // A backward that failed may have left gradients in .grad, as torch's
      // does: held, not leaked; the next step's zero_grad drops them.
      r.opt->zero_grad();
      const size_t leaked = memory_stats().bytes_in_use - in_use;
      BOOST_TEST(memory_stats().bytes_in_use == in_use, "tensor memory not given back: " << leaked << " bytes after " << error);
      if (memory_stats().bytes_in_use != in_use) ++total_sweep.leaks;
      // The next step, undisturbed, continues as the undisturbed run did.
      const double next = step(r, c);
      BOOST_TEST(next == (was_after ? loss2 : loss1));
      BOOST_TEST(bitwise_equal(state_of(r), was_after ? after2 : after));
    }
    ++total_sweep.sites;
  }
  BOOST_TEST(failures == 0, what << ": " << failures << " errors did not say out of memory");
  BOOST_TEST_MESSAGE(what << ": " << count << " allocations, each failed in turn ("
                          << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s)");
  set_num_threads(1);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(allocation)

BOOST_AUTO_TEST_CASE(counting_alone_changes_nothing) {
  // The count of the same step is the same each time, and the step's results
  // are those of a run without the switch: the sweep's n is one allocation.
  for (const Config& c : kConfigs) {
    Run warm = make_run("gpt", c);
    step(warm, c);  // the once-per-process allocations (see sweep())
    Run a = make_run("gpt", c), b = make_run("gpt", c);
    int64_t count_a = 0, count_b = 0;
    double la = 0, lb = 0;
    {
      AllocationFaults counter;
      la = step(a, c);
      count_a = counter.count();
    }
    {
      AllocationFaults counter;
      lb = step(b, c);
      count_b = counter.count();
    }
    BOOST_TEST(count_a == count_b);
    BOOST_TEST(la == lb);
    Run plain = make_run("gpt", c);
    BOOST_TEST(step(plain, c) == la);
  }
}

BOOST_AUTO_TEST_CASE(a_second_switch_is_refused) {
  AllocationFaults one;
  BOOST_CHECK_THROW(AllocationFaults two, AutogradError);
}

BOOST_AUTO_TEST_CASE(gpt_sweep) {
  for (int threads : {1, 2})
    for (const Config& c : kConfigs) sweep("gpt", c, threads);
}

BOOST_AUTO_TEST_CASE(lstm_sweep) {
  for (int threads : {1, 2})
    for (const Config& c : kConfigs) sweep("lstm", c, threads);
}

BOOST_AUTO_TEST_CASE(sweep_totals) {
  BOOST_TEST_MESSAGE("allocation sweep: " << total_sweep.sites << " allocation sites tried, 0 hangs (a hang "
                                          << "aborts the test), " << total_sweep.leaks << " leaks, "
                                          << total_sweep.half_updated << " half-updated states");
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------- I/O

BOOST_AUTO_TEST_SUITE(io)

namespace {

std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<std::string> directory(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

int64_t io_faults_tried = 0;

// Makes every I/O call of `save` (which writes its state to the path it is
// given) fail in turn, with EIO and ENOSPC: each failure is a ValueError
// naming the file and the error, leaves no temporary file, and keeps the file
// of the previous save whole. advance() changes the state, so that the next
// save differs.
void io_sweep(const std::string& what, const std::string& file_name, const std::function<void(const std::string&)>& save,
              const std::function<void()>& advance) {
  testing::TempDir dir;
  const std::string path = (dir.path / file_name).string();
  save(path);
  const std::string older = file_bytes(path);
  advance();
  std::string newer;
  int64_t counts[std::size(detail::kIoCalls)] = {};
  {
    IoFaults counter;
    save((dir.path / ("count-" + file_name)).string());
    for (IoCall call : detail::kIoCalls) counts[static_cast<size_t>(call)] = counter.count(call);
  }
  newer = file_bytes(dir.path / ("count-" + file_name));
  std::filesystem::remove(dir.path / ("count-" + file_name));
  BOOST_REQUIRE(older != newer);
  const std::vector<std::string> listing = directory(dir.path);

  for (IoCall call : detail::kIoCalls) {
    const int64_t n_calls = counts[static_cast<size_t>(call)];
    BOOST_TEST(n_calls > 0, what << " makes no " << detail::io_call_name(call) << " call");
    for (int64_t n = 0; n < n_calls; ++n) {
      for (int err : {EIO, ENOSPC}) {
        if (err == ENOSPC && (call == IoCall::rename || call == IoCall::open)) continue;  // not a full disk's error
        BOOST_TEST_CONTEXT(what << ": " << detail::io_call_name(call) << " #" << n << " failing with "
                                << strerrorname_np(err)) {
          std::string message;
          {
            IoFaults fault(call, n, err);
            try {
              save(path);
            } catch (const ValueError& e) {  // CheckpointError for the checkpoint writers
              message = e.what();
            }
            BOOST_TEST(fault.fired());
          }
          BOOST_TEST(!message.empty(), "the save did not fail");
          BOOST_TEST(message.find(path) != std::string::npos, message);
          BOOST_TEST(message.find(std::strerror(err)) != std::string::npos, message);
          BOOST_TEST(message.find(strerrorname_np(err)) != std::string::npos, message);
          BOOST_TEST(directory(dir.path) == listing, "a temporary file was left behind");
          // The rename is the commit: a call after it (the directory's open
          // and fsync, the second of each) leaves the new checkpoint.
          const bool after_rename = (call == IoCall::open || call == IoCall::fsync) && n == 1;
          const std::string now = file_bytes(path);
          BOOST_TEST((now == (after_rename ? newer : older)), "the file holds neither the old save nor the new");
          if (after_rename) {  // back to the older one for the next fault
            std::ofstream(path, std::ios::binary | std::ios::trunc) << older;
          }
          ++io_faults_tried;
        }
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(model_save) {
  Run r = make_run("gpt", Config{});
  io_sweep("save(Module)", "ckpt.safetensors", [&](const std::string& path) { nn::save(*r.module, path); },
           [&] { step(r, Config{}); });
}

BOOST_AUTO_TEST_CASE(optimizer_and_training_state_save) {
  Run r = make_run("gpt", Config{});
  auto save = [&](const std::string& path) {
    models::TrainingState s;
    s.model = "gpt", s.step = r.opt->steps(), s.seconds = 1.5;
    nn::save(*r.opt, path, models::to_metadata(s));
  };
  io_sweep("save(Optimizer) with the training state", "ckpt.safetensors", save, [&] { step(r, Config{}); });
}

BOOST_AUTO_TEST_CASE(word2vec_save) {
  for (bool binary : {false, true}) {
    models::KeyedVectors kv;
    kv.words = {"the", "of", "and"};
    kv.dim = 2;
    kv.vectors = {0.5f, -1, 2, 0.25f, -3, 1};
    kv.rebuild_index();
    io_sweep(binary ? "save_word2vec, binary" : "save_word2vec, text", "vectors.txt",
             [&](const std::string& path) { models::save_word2vec(kv, path, binary); }, [&] { kv.vectors[0] += 1; });
  }
}

BOOST_AUTO_TEST_CASE(the_older_checkpoint_still_loads) {
  // What the sweep compares as bytes, loaded: a save that failed at its write
  // leaves a checkpoint that restores the model as it was saved.
  testing::TempDir dir;
  const std::string path = (dir.path / "m.safetensors").string();
  Run r = make_run("gpt", Config{});
  nn::save(*r.module, path);
  const State saved = state_of(r);
  step(r, Config{});
  {
    IoFaults fault(IoCall::write, 0, ENOSPC);
    BOOST_CHECK_THROW(nn::save(*r.module, path), nn::CheckpointError);
  }
  Run fresh = make_run("gpt", Config{});
  step(fresh, Config{});
  nn::load(*fresh.module, path);
  State loaded = state_of(fresh), expected = saved;
  // Only the parameters: the optimizer's state is not in a model's checkpoint.
  std::erase_if(loaded, [](auto& e) { return e.first.starts_with("opt."); });
  std::erase_if(expected, [](auto& e) { return e.first.starts_with("opt."); });
  BOOST_TEST(bitwise_equal(loaded, expected));
}

BOOST_AUTO_TEST_CASE(a_file_cut_short_is_refused) {
  // What a writer killed mid-save leaves (its temporary file, or a copy cut
  // short): refused at every length, with the file named.
  testing::TempDir dir;
  const std::string path = (dir.path / "m.safetensors").string(), cut = (dir.path / "cut.safetensors").string();
  Run r = make_run("gpt", Config{});
  nn::save(*r.module, path);
  const std::string bytes = file_bytes(path);
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::ofstream(cut, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(len));
    try {
      nn::load(*r.module, cut);
      BOOST_ERROR("a file cut to " << len << " of " << bytes.size() << " bytes loaded");
    } catch (const nn::CheckpointError& e) {
      BOOST_TEST(std::string(e.what()).find(cut) != std::string::npos, e.what());
    }
  }
  BOOST_TEST_MESSAGE("a checkpoint cut at each of its " << bytes.size() << " lengths: refused");
}

BOOST_AUTO_TEST_CASE(io_totals) {
  BOOST_TEST_MESSAGE("I/O sweep: " << io_faults_tried << " I/O faults tried");
}

BOOST_AUTO_TEST_SUITE_END()
