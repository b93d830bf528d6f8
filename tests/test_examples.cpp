// The bundled examples, end to end at tiny sizes (seconds each): they run,
// write what they promise, their losses go down, and charlm --resume
// continues a run exactly. The executables' paths come from meson (env).
#define BOOST_TEST_MODULE examples
#include <boost/test/unit_test.hpp>

#include "programs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace {

using testing::exe, testing::read_text, testing::run;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("tg_test_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// loss.csv rows: model -> [(step, train, val)].
std::map<std::string, std::vector<std::array<double, 3>>> read_curves(const fs::path& csv) {
  std::map<std::string, std::vector<std::array<double, 3>>> out;
  std::istringstream in(read_text(csv));
  std::string line;
  std::getline(in, line);
  BOOST_REQUIRE_EQUAL(line, "model,step,tokens,train_loss,val_loss");
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    BOOST_REQUIRE_EQUAL(f.size(), 5u);
    out[f[0]].push_back({std::stod(f[1]), std::stod(f[3]), std::stod(f[4])});
  }
  return out;
}

const std::string kTiny = "tests/fixtures/tiny.txt";  // synthetic sentences, 3 KB
const std::string kCharlmTiny =
    " --data " + kTiny + " --batch 8 --block 16 --eval-every 10 --eval-batches 2 --gpt-dim 16 --gpt-layers 1"
    " --gpt-heads 2 --embed 8 --sample-len 30 --threads 1 --warmup 5 --lr 1e-2";

}  // namespace

BOOST_AUTO_TEST_CASE(charlm_trains_all_models_and_writes_its_outputs) {
  fs::path out = fresh_dir("charlm");
  auto [rc, log] = run(exe("CHARLM") + kCharlmTiny + " --steps 40 --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  auto curves = read_curves(out / "loss.csv");
  for (const char* m : {"rnn", "lstm", "gpt"}) {
    BOOST_REQUIRE_MESSAGE(curves[m].size() == 4u, m);
    // Validation loss after 40 steps is well below the first evaluation's.
    BOOST_TEST(curves[m].back()[2] < curves[m].front()[2] - 0.1, m << ": " << curves[m].front()[2] << " -> " << curves[m].back()[2]);
    BOOST_TEST(fs::exists(out / fmt::format("{}.safetensors", m)));
    BOOST_TEST(fs::exists(out / fmt::format("{}.state.safetensors", m)));
  }
  std::string samples = read_text(out / "samples.txt");
  for (const char* m : {"=== rnn ===", "=== lstm ===", "=== gpt ==="}) BOOST_TEST(samples.find(m) != std::string::npos);
  BOOST_TEST(log.find("val bits/char") != std::string::npos);  // the table
  BOOST_TEST(fs::exists(out / "results.md"));
  // Headed by when, where and from which commit it was measured (report::provenance).
  BOOST_TEST(read_text(out / "results.md").find(" cores; commit ") != std::string::npos);
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) BOOST_TEST(fs::file_size(out / "loss.png") > 1000u);

  // generate rebuilds the model from the checkpoint and samples reproducibly.
  std::string gen = exe("GENERATE") + " " + (out / "gpt.safetensors").string() + " --prompt 'The ' --tokens 25 --seed 5";
  auto [g1, s1] = run(gen);
  auto [g2, s2] = run(gen);
  BOOST_REQUIRE_MESSAGE(g1 == 0, s1);
  BOOST_TEST(s1 == s2);
  BOOST_TEST(s1.find("The ") != std::string::npos);
  auto [g3, s3] = run(exe("GENERATE") + " " + (out / "missing.safetensors").string());
  BOOST_TEST(g3 == 1);
  BOOST_TEST(s3.find("missing.safetensors") != std::string::npos);
  fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(charlm_resume_continues_exactly) {
  // 30 steps in one go == stopped after 25 (between the evaluations at 20 and
  // 30), then --resume to 30; dropout on, so the generator states must be
  // restored too. The curve has the same 3 rows, the same mean training loss
  // over steps 21-30, and the weights are the same bytes.
  fs::path a = fresh_dir("resume_a"), b = fresh_dir("resume_b");
  std::string common = exe("CHARLM") + kCharlmTiny + " --models gpt,lstm --dropout 0.1";
  auto [r1, l1] = run(common + " --steps 30 --out " + a.string());
  BOOST_REQUIRE_MESSAGE(r1 == 0, l1);
  auto [r2, l2] = run(common + " --steps 30 --stop-after 25 --out " + b.string());
  BOOST_REQUIRE_MESSAGE(r2 == 0, l2);
  // The interrupted run's bars end at its stop, not at the full 30 steps.
  BOOST_TEST(l2.find("30/30") == std::string::npos, l2);
  BOOST_TEST(l2.find("25/25  stopped at step 25 of 30") != std::string::npos, l2);
  auto [r3, l3] = run(common + " --steps 30 --resume --out " + b.string());
  BOOST_REQUIRE_MESSAGE(r3 == 0, l3);
  BOOST_TEST(l3.find("resumed at step 25") != std::string::npos, l3);
  BOOST_TEST(l3.find("30/30") != std::string::npos, l3);
  auto ca = read_curves(a / "loss.csv"), cb = read_curves(b / "loss.csv");
  for (const char* m : {"gpt", "lstm"}) {
    BOOST_REQUIRE_EQUAL(ca[m].size(), 3u);
    BOOST_REQUIRE_EQUAL(cb[m].size(), 3u);
    for (size_t i = 0; i < ca[m].size(); ++i)
      for (int k = 0; k < 3; ++k) BOOST_TEST(ca[m][i][k] == cb[m][i][k], m << " row " << i << " col " << k);
    const std::string weights = fmt::format("{}.safetensors", m);
    BOOST_TEST((read_text(a / weights) == read_text(b / weights)), m << ": the resumed weights differ");
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

BOOST_AUTO_TEST_CASE(charlm_stops_on_a_non_finite_loss_and_keeps_the_last_good_checkpoint) {
  // At lr 1e30 the first update makes the weights overflow the next forward.
  fs::path out = fresh_dir("charlm_nan");
  const std::string common = exe("CHARLM") + " --data " + kTiny +
                             " --batch 8 --block 16 --eval-every 1 --eval-batches 2 --gpt-dim 16 --gpt-layers 1"
                             " --gpt-heads 2 --sample-len 10 --threads 1 --warmup 0 --lr 1e30 --models gpt --out " +
                             out.string();
  auto [rc, log] = run(common + " --steps 20");
  BOOST_TEST(rc == 1);
  BOOST_TEST(log.find("charlm: gpt, step 2: the loss is NaN; stopped before its backward") != std::string::npos, log);
  BOOST_TEST(log.find("anomaly detected in forward: 'linear' in blocks.0.attn.qkv") != std::string::npos, log);
  // The checkpoint of step 1 (the last finite state) loads and resumes.
  auto [rc2, log2] = run(common + " --steps 1 --resume");
  BOOST_TEST(rc2 == 0, log2);
  BOOST_TEST(log2.find("resumed at step 1") != std::string::npos, log2);
  fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(charlm_bad_input_is_a_clear_error) {
  auto [rc, log] = run(exe("CHARLM") + " --data /nonexistent/file.txt --steps 1");
  BOOST_TEST(rc == 1);
  BOOST_TEST(log.find("/nonexistent/file.txt") != std::string::npos, log);
  auto [rc2, log2] = run(exe("CHARLM") + " --models transformer");
  BOOST_TEST(rc2 != 0);
  BOOST_TEST(log2.find("--models") != std::string::npos, log2);
}

BOOST_AUTO_TEST_CASE(seq2seq_runs_and_learns) {
  fs::path out = fresh_dir("seq2seq");
  auto [rc, log] = run(exe("SEQ2SEQ") + " --steps 60 --batch 16 --min-len 2 --max-len 4 --eval-per-len 20 --hidden 32"
                       " --dim 32 --lr 1e-2 --threads 1 --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  std::istringstream csv(read_text(out / "accuracy.csv"));
  std::string line;
  std::getline(csv, line);
  BOOST_TEST(line == "length,lstm,attention,transformer");
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  BOOST_TEST(rows == 3);
  // The printed table's final losses are below the uniform guess ln(13) = 2.56.
  for (const char* m : {"lstm ", "attention ", "transformer "}) {
    auto at = log.rfind(m);
    BOOST_REQUIRE(at != std::string::npos);
    std::istringstream row(log.substr(at + std::string(m).size()));
    long params;
    double loss;
    row >> params >> loss;
    BOOST_TEST(loss < 2.3, m << "final loss " << loss);
  }
  fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(custom_model_example_learns_and_reloads) {
  auto [rc, log] = run(exe("CUSTOM_MODEL"));
  BOOST_TEST(rc == 0, log);  // exits 1 unless the MSE fell 5x and the reload is exact
  BOOST_TEST(log.find("(fc1): Linear") != std::string::npos, log);  // the module tree printout
  BOOST_TEST(log.find("reloaded: max difference 0") != std::string::npos, log);
}

namespace {

// A Brown-format directory with three genres whose passages use disjoint
// words, so a classifier can tell them apart after a few dozen steps.
fs::path fake_brown(const fs::path& dir) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> genres = {
      {"ca", {"senate", "vote", "mayor", "election", "council", "tax", "bill", "governor"}},
      {"cf", {"garden", "recipe", "kitchen", "flower", "soil", "bake", "oven", "seed"}},
      {"cn", {"horse", "sheriff", "saddle", "canyon", "rifle", "ranch", "dust", "trail"}}};
  uint64_t x = 12345;
  for (const auto& [prefix, words] : genres)
    for (int d = 1; d <= 8; ++d) {
      std::string text = "\n\n\t";
      for (int w = 0; w < 120; ++w) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        text += words[(x >> 33) % words.size()] + "/nn " + (w % 12 == 11 ? "./.\n" : "");
      }
      std::ofstream(dir / fmt::format("{}{:02}", prefix, d)) << text;
    }
  return dir;
}

// The accuracy column of the printed table's row for `model`.
double accuracy_of(const std::string& log, const std::string& model, int column) {
  auto at = log.rfind("\n" + model + " ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, model << " row missing:\n" << log);
  std::istringstream row(log.substr(at + model.size() + 1));
  std::string cell;
  for (int i = 0; i <= column; ++i) row >> cell;
  return std::stod(cell);  // "93.8%" -> 93.8
}

}  // namespace

BOOST_AUTO_TEST_CASE(classify_learns_genres) {
  fs::path out = fresh_dir("classify"), brown = fake_brown(fresh_dir("classify_brown"));
  auto [rc, log] = run(exe("CLASSIFY") + " --brown-dir " + brown.string() + " --steps 80 --batch 8 --passage 16" +
                       " --dim 16 --layers 1 --heads 2 --lr 1e-2 --threads 1 --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  BOOST_TEST(log.find("3 genres") != std::string::npos, log);
  // params, train acc, val acc: chance is 33%.
  BOOST_TEST(accuracy_of(log, "bag-of-embeddings", 2) > 90.0, log);
  BOOST_TEST(accuracy_of(log, "transformer", 2) > 90.0, log);
  BOOST_TEST(read_text(out / "confusion.txt").find("confusion matrix, transformer") != std::string::npos);
  auto [bad_rc, bad_log] = run(exe("CLASSIFY") + " --brown-dir " + (out / "missing").string());
  BOOST_TEST(bad_rc != 0);
  BOOST_TEST(bad_log.find("missing") != std::string::npos, bad_log);
  fs::remove_all(out);
  fs::remove_all(brown);
}

namespace {

// bench/lm_train: from meson when it passes LM_TRAIN, else beside examples/
// in the same build tree.
std::string lm_train() {
  if (const char* p = std::getenv("LM_TRAIN"); p && *p) return p;
  const fs::path p = fs::path(exe("CHARLM")).parent_path().parent_path() / "bench" / "lm_train";
  BOOST_REQUIRE_MESSAGE(fs::exists(p), p << " is missing: build bench/lm_train");
  return p.string();
}

BOOST_AUTO_TEST_CASE(gemm_backend_choices_are_kept_per_machine) {
  // The first process times the backends (four float32 classes, bfloat16's
  // small one) and writes the cache; the next reads the same five choices from it; a damaged cache is refused with
  // its line, timed again and rewritten whole.
  fs::path cache = fresh_dir("gemm_cache"), text = fresh_dir("gemm_cache_text");
  fs::copy_file(kTiny, text / "train.txt");
  fs::copy_file(kTiny, text / "val.txt");
  const std::string lm = "env -u TAPEGRAD_GEMM_F32 TAPEGRAD_CACHE_DIR=" + cache.string() + " " + lm_train() +
                         " --workload rnn --text-dir " + text.string() + " --warmup 0 --steps 1 --threads 1 --profile";
  const fs::path file = cache / "gemm.tsv";
  auto choices = [](const std::string& log) {  // "tiny 64x64x32: oneDNN" and so on, in order
    std::vector<std::string> out;
    for (const char* name : {"tiny ", "narrow ", "short_k ", "large ", "bf16_small "}) {
      const size_t at = log.find(std::string("; ") + name);
      out.push_back(at == std::string::npos ? "" : log.substr(at + 2, log.find(" (", at) - at - 2));
    }
    return out;
  };
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  auto [r1, l1] = run(lm);
  BOOST_REQUIRE_MESSAGE(r1 == 0, l1);
  BOOST_TEST(count(l1, ", cached)") == 0u, l1);
  BOOST_TEST(count(read_text(file), "\t") == 5u * 5u, read_text(file));
  auto [r2, l2] = run(lm);
  BOOST_REQUIRE_MESSAGE(r2 == 0, l2);
  BOOST_TEST(count(l2, ", cached)") == 5u, l2);
  BOOST_TEST(choices(l2) == choices(l1), l1 << l2);
  BOOST_TEST(choices(l1)[0] != "");
  // The choice is made again from the GFLOP/s, not read from the backend
  // column (a file written under another margin): swapping its words changes nothing.
  std::string swapped = read_text(file);
  for (auto [from, to] : {std::pair{"\topenblas\t", "\tOPENBLAS\t"}, {"\tonednn\t", "\topenblas\t"},
                          {"\tOPENBLAS\t", "\tonednn\t"}})
    for (size_t at = swapped.find(from); at != std::string::npos; at = swapped.find(from, at + 1))
      swapped.replace(at, std::string(from).size(), to);
  BOOST_TEST(swapped != read_text(file));
  std::ofstream(file) << swapped;
  auto [r4, l4] = run(lm);
  BOOST_REQUIRE_MESSAGE(r4 == 0, l4);
  BOOST_TEST(count(l4, ", cached)") == 5u, l4);
  BOOST_TEST(choices(l4) == choices(l1), l1 << l4);
  std::ofstream(file, std::ios::app) << "a line of another format\n";
  auto [r3, l3] = run(lm);
  BOOST_REQUIRE_MESSAGE(r3 == 0, l3);
  BOOST_TEST(l3.find("refusing the GEMM cache " + file.string() + ": line 7: 1 tab-separated fields") !=
                 std::string::npos, l3);
  BOOST_TEST(count(l3, ", cached)") == 0u, l3);
  BOOST_TEST(count(read_text(file), "\t") == 5u * 5u, read_text(file));
  BOOST_TEST(read_text(file).find("another format") == std::string::npos);
  fs::remove_all(cache);
  fs::remove_all(text);
}

// The number after `"key": ` in a JSON line.
double json_number(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\": ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, key << " missing in " << line);
  return std::stod(line.substr(at + key.size() + 4));
}

}  // namespace

BOOST_AUTO_TEST_CASE(bf16_autocast_trains_like_float32) {
  // --bf16 rounds the GEMMs' operands to bfloat16 (8 significant bits, float32
  // accumulation), so a short run lands within a few hundredths of the
  // float32 one; each program says which precision ran.
  fs::path out32 = fresh_dir("charlm_f32"), out16 = fresh_dir("charlm_bf16");
  const std::string charlm = exe("CHARLM") + kCharlmTiny + " --models gpt --steps 40";
  auto [r32, l32] = run(charlm + " --out " + out32.string());
  BOOST_REQUIRE_MESSAGE(r32 == 0, l32);
  auto [r16, l16] = run(charlm + " --bf16 --out " + out16.string());
  BOOST_REQUIRE_MESSAGE(r16 == 0, l16);
  auto c32 = read_curves(out32 / "loss.csv"), c16 = read_curves(out16 / "loss.csv");
  BOOST_REQUIRE_EQUAL(c16["gpt"].size(), 4u);
  BOOST_TEST(c16["gpt"].back()[2] < c16["gpt"].front()[2] - 0.1);
  BOOST_TEST(std::abs(c16["gpt"].back()[2] - c32["gpt"].back()[2]) < 0.05,
             c16["gpt"].back()[2] << " (bf16) against " << c32["gpt"].back()[2] << " (f32)");
  BOOST_TEST(read_text(out16 / "results.md").find("GEMMs in bfloat16 (autocast)") != std::string::npos);
  BOOST_TEST(read_text(out32 / "results.md").find("GEMMs in float32") != std::string::npos);

  // lm_train: a few steps on the tiny text (as train and validation text):
  // GPT-S for the step's loss, the LSTM (cheaper to evaluate) for --eval too.
  fs::path text = fresh_dir("lm_train_text");
  fs::copy_file(kTiny, text / "train.txt");
  fs::copy_file(kTiny, text / "val.txt");
  const std::string lm = lm_train() + " --text-dir " + text.string() + " --warmup 1 --steps 2 --threads 1";
  for (const auto& [workload, eval] : {std::pair<std::string, bool>{"gpt-s", false}, {"lstm", true}}) {
    const std::string cmd = lm + " --workload " + workload + (eval ? " --eval" : "");
    auto [t32, j32] = run(cmd + " --dtype f32");
    BOOST_REQUIRE_MESSAGE(t32 == 0, j32);
    auto [t16, j16] = run(cmd + " --dtype bf16");
    BOOST_REQUIRE_MESSAGE(t16 == 0, j16);
    BOOST_TEST(j32.find("\"dtype\": \"f32\"") != std::string::npos, j32);
    BOOST_TEST(j16.find("\"dtype\": \"bf16\"") != std::string::npos, j16);
    for (const std::string key : {"last_loss", "val_loss"})
      if (key == "last_loss" || eval)
        BOOST_TEST(std::abs(json_number(j16, key) - json_number(j32, key)) < 0.05,
                   workload << " " << key << ":\n" << j32 << j16);
  }
  auto [bad, bad_log] = run(lm + " --dtype f16");
  BOOST_TEST(bad != 0);
  BOOST_TEST(bad_log.find("--dtype") != std::string::npos, bad_log);

  // seq2seq and classify take the flag and say so.
  auto [rs, ls] = run(exe("SEQ2SEQ") + " --models transformer --steps 5 --batch 8 --min-len 2 --max-len 3 --eval-per-len 4"
                      " --dim 16 --threads 1 --bf16 --out " + out16.string());
  BOOST_REQUIRE_MESSAGE(rs == 0, ls);
  BOOST_TEST(ls.find("GEMMs in bfloat16 (autocast)") != std::string::npos, ls);
  fs::path brown = fake_brown(fresh_dir("bf16_brown"));
  auto [rc, lc] = run(exe("CLASSIFY") + " --brown-dir " + brown.string() + " --steps 5 --batch 8 --passage 16 --dim 16"
                      " --layers 1 --heads 2 --threads 1 --bf16 --out " + out16.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, lc);
  BOOST_TEST(lc.find("GEMMs in bfloat16 (autocast)") != std::string::npos, lc);
  for (const fs::path& d : {out32, out16, text, brown}) fs::remove_all(d);
}

BOOST_AUTO_TEST_CASE(word2vec_trains_and_writes_vectors) {
  fs::path out = fresh_dir("word2vec");
  std::ofstream(out / "pairs.tsv") << "bird\tdog\t8\nsister\tteacher\t6\nfarmer\tman\t5\nchild\tdog\t3\n";
  auto [rc, log] = run(exe("WORD2VEC") + " --data " + kTiny + " --min-count 1 --dim 16 --epochs 5 --threads 1" +
                       " --neighbours bird --similarity " + (out / "pairs.tsv").string() +
                       " --out " + (out / "vec.txt").string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  BOOST_TEST(log.find("similarity") != std::string::npos, log);
  BOOST_TEST(log.find("on 4 of 4 pairs") != std::string::npos, log);
  // Text format: "V dim" then V lines of a word and dim numbers.
  std::istringstream vec(read_text(out / "vec.txt"));
  size_t V = 0, dim = 0;
  vec >> V >> dim;
  BOOST_TEST(dim == 16u);
  BOOST_TEST(V > 20u);
  std::string line;
  std::getline(vec, line);
  size_t rows = 0;
  while (std::getline(vec, line)) {
    std::istringstream fields(line);
    std::string w;
    double v;
    size_t n = 0;
    for (fields >> w; fields >> v;) ++n;
    BOOST_REQUIRE_EQUAL(n, dim);
    ++rows;
  }
  BOOST_TEST(rows == V);
  auto [bad_rc, bad_log] = run(exe("WORD2VEC") + " --data " + (out / "nope.txt").string());
  BOOST_TEST(bad_rc != 0);
  BOOST_TEST(bad_log.find("nope.txt") != std::string::npos, bad_log);
  fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(higher_order_checks_hvp_and_compares_maml) {
  auto [rc, log] = run(exe("HIGHER_ORDER") + " --quick --threads 1");
  BOOST_REQUIRE_MESSAGE(rc == 0, log);  // exits 1 when double backward and finite differences disagree
  BOOST_TEST(log.find("hvp check: max relative difference") != std::string::npos, log);
  BOOST_TEST(log.find(": ok") != std::string::npos, log);
  for (const char* row : {"\nmethod ", "\nMAML ", "\nfirst-order MAML ", "\npre-training "})
    BOOST_TEST(log.find(row) != std::string::npos, row << " missing:\n" << log);
  BOOST_TEST(log.find("mean |df/dx|") != std::string::npos, log);  // the gradient-penalty table
}

BOOST_AUTO_TEST_CASE(forward_mode_tracks_sharpness_and_compares_jacobians) {
  const fs::path out = fs::temp_directory_path() / fmt::format("tg_test_forward_mode_{}", ::getpid());
  auto [rc, log] = run(exe("FORWARD_MODE") + " --quick --threads 1 --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);  // exits 1 when the forward and reverse Jacobians disagree
  BOOST_TEST(log.find("lambda_1") != std::string::npos, log);
  BOOST_TEST(log.find("max |J_forward - J_reverse|") != std::string::npos, log);
  BOOST_TEST(log.find(": ok") != std::string::npos, log);
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) BOOST_TEST(fs::file_size(out / "sharpness.png") > 1000u);
  fs::remove_all(out);
}
