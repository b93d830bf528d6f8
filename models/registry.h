#pragma once
// Language models by name and settings, so a checkpoint can say what it holds
// (its metadata is config()) and `generate` can rebuild the model from it.
#include <map>
#include <memory>
#include <string>

#include "language_model.h"

namespace tg::models {

using Config = std::map<std::string, std::string>;

// The settings that rebuild m: {"model": "gpt"|"rnn"|"lstm"|"gru", "vocab": ..., ...}.
Config config_of(const LanguageModel& m);
// Builds the model a config describes (fresh weights); ValueError naming a
// missing or bad field.
std::shared_ptr<LanguageModel> make_language_model(const Config& config);

}  // namespace tg::models
