// server::ReasoningParser (see reasoning.h). Tested by tests/server/test_reasoning.cpp.
#include "server/reasoning.h"

#include <array>

#include "server/markup.h"

namespace fp4moe::server {

namespace {

constexpr std::array<ReasoningFormat, 3> kFormats = {{
    {"glm45", "<think>", "</think>", false},
    {"qwen3", "<think>", "</think>", false},
    {"deepseek-r1", "<think>", "</think>", true},
}};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

const ReasoningFormat* find_reasoning_format(std::string_view name) { return markup::find_by_name(kFormats, name); }

std::string reasoning_format_names() { return markup::names_of(kFormats); }

ReasoningStart reasoning_start_of_prompt(const ReasoningFormat& format, std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  if (prompt.ends_with(format.start)) return ReasoningStart::kInside;
  if (prompt.ends_with(format.end)) return ReasoningStart::kAnswer;
  return ReasoningStart::kFormat;
}

ReasoningParser::ReasoningParser(const ReasoningFormat& format, ReasoningStart start) : f_(&format) {
  if (start == ReasoningStart::kInside) {
    phase_ = Phase::kReasoning;
    saw_reasoning_ = true;
  } else if (start == ReasoningStart::kAnswer) {
    phase_ = Phase::kContent;
    content_started_ = true;  // the answer passes through as it is
  }
}

void ReasoningParser::to_content(std::string_view s, ReasoningSplit& out) {
  if (!content_started_) {
    size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    s.remove_prefix(i);
    content_started_ = !s.empty();
  }
  out.content += s;
}

ReasoningSplit ReasoningParser::push(std::string_view delta) {
  ReasoningSplit out;
  held_ += delta;
  while (!held_.empty()) {
    if (phase_ == Phase::kStart) {
      size_t i = 0;
      while (i < held_.size() && is_space(held_[i])) ++i;
      const std::string_view rest = std::string_view(held_).substr(i);
      if (rest.substr(0, f_->start.size()) == f_->start) {
        held_.erase(0, i + f_->start.size());
        phase_ = Phase::kReasoning;
        saw_reasoning_ = true;
        continue;
      }
      if (f_->start.substr(0, rest.size()) == rest) return out;  // may still become the start tag
      phase_ = f_->forced ? Phase::kReasoning : Phase::kContent;
      saw_reasoning_ = f_->forced;
      content_started_ = !f_->forced;  // a reply without reasoning passes through as it is
      continue;
    }
    if (phase_ == Phase::kReasoning) {
      const size_t end = held_.find(f_->end);
      if (end == std::string::npos) {
        const size_t keep = markup::partial_tag_suffix(held_, f_->end);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      out.reasoning += held_.substr(0, end);
      held_.erase(0, end + f_->end.size());
      phase_ = Phase::kContent;
      continue;
    }
    to_content(held_, out);
    held_.clear();
  }
  return out;
}

ReasoningSplit ReasoningParser::finish() {
  ReasoningSplit out;
  if (phase_ == Phase::kReasoning || (phase_ == Phase::kStart && f_->forced)) {
    out.reasoning = std::move(held_);
  } else if (phase_ == Phase::kStart) {
    out.content = std::move(held_);  // whitespace, or a piece of the start tag: no reasoning
  } else {
    to_content(held_, out);
  }
  held_.clear();
  return out;
}

ReasoningSplit ReasoningParser::take(std::string_view delta, bool last) {
  ReasoningSplit out = push(delta);
  if (last) {
    ReasoningSplit tail = finish();
    out.reasoning += tail.reasoning;
    out.content += tail.content;
  }
  return out;
}

ReasoningSplit split_reasoning(const ReasoningFormat& format, std::string_view text, ReasoningStart start) {
  return ReasoningParser(format, start).take(text, /*last=*/true);
}

}  // namespace fp4moe::server
