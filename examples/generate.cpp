// generate — samples text from any language-model checkpoint that charlm (or
// your own code, through models::config_of) wrote. The checkpoint's metadata
// says which model it is; the tokenizer comes from the file charlm saved
// beside it.
//
//   build/examples/generate out/charlm/gpt.safetensors --prompt "The " --tokens 300 --temperature 0.8 --top-k 20
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/tokenizer.h"
#include "models/generate.h"
#include "models/registry.h"
#include "nn/checkpoint.h"

namespace fs = std::filesystem;
using namespace tg;

int main(int argc, char** argv) {
  std::string checkpoint, tokenizer, prompt = "The ";
  models::SamplingOptions o{.max_new_tokens = 300, .temperature = 0.8};
  uint64_t seed = 1;
  int64_t samples = 1;
  CLI::App app{"generate: sample text from a language-model checkpoint"};
  app.add_option("checkpoint", checkpoint, "A .safetensors file written by charlm")->required();
  app.add_option("--tokenizer", tokenizer, "Tokenizer file (default: tokenizer.json beside the checkpoint)");
  app.add_option("--prompt", prompt, "Text to continue");
  app.add_option("--tokens", o.max_new_tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", o.temperature, "Sampling temperature (> 0)");
  app.add_option("--top-k", o.top_k, "Sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  app.add_flag("--greedy", o.greedy, "Always take the most likely token");
  app.add_option("--samples", samples, "How many samples")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Sampling seed");
  CLI11_PARSE(app, argc, argv);

  try {
    if (tokenizer.empty()) tokenizer = (fs::path(checkpoint).parent_path() / "tokenizer.json").string();
    auto tok = data::load_tokenizer(tokenizer);
    nn::TensorFile file = nn::load_tensors(checkpoint);
    auto model = models::make_language_model(file.metadata);
    nn::load(*model, checkpoint);
    if (model->vocab_size() != tok->vocab_size())
      throw ValueError(fmt::format("{} has a vocabulary of {} but the tokenizer {} has {}", checkpoint,
                                   model->vocab_size(), tokenizer, tok->vocab_size()));
    fmt::print(stderr, "generate: {} ({} parameters) from {}\n", model->type_name(), model->num_parameters(), checkpoint);
    Generator gen(seed);
    for (int64_t s = 0; s < samples; ++s) {
      auto ids = models::generate(*model, tok->encode(prompt), o, gen);
      fmt::print("{}{}\n", prompt, tok->decode(ids));
      if (s + 1 < samples) fmt::print("---\n");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "generate: {}\n", e.what());
    return 1;
  }
  return 0;
}
