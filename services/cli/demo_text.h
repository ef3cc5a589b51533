// The prompts `cascade demo` sends: one long shared system prompt and a set of user questions.
#pragma once

#include <string>
#include <vector>

namespace cascade::cli {

// A realistic system prompt of a few hundred tokens, shared by every demo request.
const std::string& DemoSystemPrompt();
// Distinct user questions; the demo cycles through them.
const std::vector<std::string>& DemoQueries();

}  // namespace cascade::cli
