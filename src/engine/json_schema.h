// engine::json_schema_to_regex: a JSON schema as a regex (engine/regex_dfa.h syntax) whose matches are
// JSON texts the schema accepts, the way outlines and SGLang's regex backends build structured outputs
// from a schema. Objects list their properties in the schema's order (required ones always, optional
// ones may be left out), with no other keys: what `additionalProperties: false` asks, and a valid
// reply under `true` too. Whitespace between tokens is the given pattern.
//
// Supported: type (one or a list), properties, required, additionalProperties (false / true / a
// schema, when there are no properties), items, minItems, maxItems, enum, const, anyOf, oneOf (as
// anyOf), allOf of one schema, $ref into the document (#/$defs/..., #/definitions/...; not recursive),
// minLength, maxLength, pattern (anchors stripped; it must match the whole string), format (date, time,
// date-time, uuid), minimum / maximum / exclusiveMinimum / exclusiveMaximum on integers (exact decimal
// ranges), nullable, and the annotations (title, description, default, examples, $schema, $id,
// $comment, strict). A schema with no type (`{}`, `true`) is any JSON value nested at most
// kAnyValueDepth containers deep. Anything else (bounds on numbers, uniqueItems, prefixItems,
// recursion, a combinator or $ref beside constraining keywords, minLength beside pattern, a pattern
// that can spell what JSON strings escape, depth over 64, a regex over 1 MiB) is refused naming the
// keyword and where it is (a JSON pointer), rather than quietly ignored.
//
// Tested by tests/engine/test_constraint.cpp.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace fp4moe::engine {

inline constexpr int kAnyValueDepth = 2;

// Fails (fp4moe::Error) naming the keyword and its JSON pointer. strings_without_lt: JSON strings may not
// contain '<' as such ("\u003c" still does): values written inside markup (forced tool calls).
std::string json_schema_to_regex(const nlohmann::ordered_json& schema, const std::string& whitespace,
                                 bool strings_without_lt = false);

}  // namespace fp4moe::engine
