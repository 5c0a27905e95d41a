// The JSON writer (escaping, numbers, layout) and the parser (fio reports, sweep configs).
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "json.hpp"

namespace deepio::cli {
namespace {

TEST(Json, EscapesWhatJsonRequires) {
  EXPECT_EQ(Json::quote("plain"), "\"plain\"");
  EXPECT_EQ(Json::quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(Json::quote("l1\nl2\tt\rr"), "\"l1\\nl2\\tt\\rr\"");
  EXPECT_EQ(Json::quote(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(Json::quote(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  EXPECT_EQ(Json::quote("caf\xc3\xa9 /"), "\"caf\xc3\xa9 /\"") << "UTF-8 and / pass through";
}

TEST(Json, NumbersAreExactOrPythonRepr) {
  Json j(0);
  j.begin_array();
  j.item(0.1).item(1.0).item(1e-05);
  j.item(std::numeric_limits<double>::quiet_NaN()).item(std::numeric_limits<double>::infinity());
  j.value({}, std::uint64_t{18446744073709551615ULL}).value({}, std::int64_t{-9007199254740993LL}).value({}, -3);
  j.end_array();
  EXPECT_EQ(j.str(), "[\n0.1,\n1.0,\n1e-05,\nnull,\nnull,\n18446744073709551615,\n-9007199254740993,\n-3\n]\n");
}

TEST(Json, LayoutIsIndentedAndDeterministic) {
  Json j;
  j.begin_object();
  j.value("s", "x").value("b", true).null("n");
  j.begin_object("empty").end_object();
  j.begin_array("list").item("a").item(2.5).end_array();
  j.begin_array("none").end_array();
  j.value_or_null("m", 1.5, true).value_or_null("u", 1.5, false);
  j.end_object();
  EXPECT_EQ(j.str(),
            "{\n"
            "  \"s\": \"x\",\n"
            "  \"b\": true,\n"
            "  \"n\": null,\n"
            "  \"empty\": {},\n"
            "  \"list\": [\n"
            "    \"a\",\n"
            "    2.5\n"
            "  ],\n"
            "  \"none\": [],\n"
            "  \"m\": 1.5,\n"
            "  \"u\": null\n"
            "}\n");
  Json three(3);
  three.begin_object().begin_object("aio").value("k", 1).end_object().end_object();
  EXPECT_EQ(three.str(), "{\n   \"aio\": {\n      \"k\": 1\n   }\n}\n") << "ds_nvme_tune's indent";
}

TEST(Json, ParserReadsWhatTheWriterWrites) {
  Json j;
  j.begin_object();
  j.value("text", "q\"\\\n\x01 caf\xc3\xa9");
  j.value("num", 0.30000000000000004).value("int", std::uint64_t{1} << 52).value("neg", -7);
  j.value("yes", true).value("no", false).null("nothing");
  j.begin_array("arr").item(1.0).item("two").end_array();
  j.end_object();
  std::string error;
  const auto v = parse_json(j.str(), &error);
  ASSERT_TRUE(v) << error;
  EXPECT_EQ(v->get("text")->string, "q\"\\\n\x01 caf\xc3\xa9");
  EXPECT_EQ(v->num("num"), 0.30000000000000004);
  EXPECT_EQ(v->num("int"), 4503599627370496.0);
  EXPECT_EQ(v->num("neg"), -7.0);
  EXPECT_TRUE(v->get("yes")->boolean);
  EXPECT_EQ(v->get("no")->type, JsonValue::Type::Bool);
  EXPECT_FALSE(v->get("no")->boolean);
  EXPECT_EQ(v->get("nothing")->type, JsonValue::Type::Null);
  ASSERT_EQ(v->get("arr")->array.size(), 2U);
  EXPECT_EQ(v->get("arr")->at(1)->string, "two");
  EXPECT_EQ(v->get("arr")->at(2), nullptr);
  EXPECT_EQ(v->get("missing"), nullptr);
  EXPECT_EQ(v->num("text", -1.0), -1.0) << "not a number: the fallback";
  EXPECT_EQ(v->get("arr")->get("x"), nullptr);
}

TEST(Json, UnicodeEscapesBecomeUtf8) {
  const auto v = parse_json(R"(["\u0041", "\u00e9", "\u20ac", "\n\t\/\b\f"])");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->at(0)->string, "A");
  EXPECT_EQ(v->at(1)->string, "\xc3\xa9");
  EXPECT_EQ(v->at(2)->string, "\xe2\x82\xac");
  EXPECT_EQ(v->at(3)->string, "\n\t/\b\f");
}

TEST(Json, ParseErrorsSayWhatAndWhere) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "unexpected end at offset 0"},
      {"[1,2", "expected ',' or ']' at offset 4"},
      {"{\"a\" 1}", "expected ':' at offset 5"},
      {"{1: 2}", "expected a string key at offset 1"},
      {"\"open", "unterminated string at offset 5"},
      {"tru", "invalid literal at offset 0"},
      {"[1] x", "unexpected text after the JSON value at offset 4"},
      {"\"\\u12\"", "bad \\u escape at offset 3"},
      {"@", "invalid value at offset 0"},
  };
  for (const auto& [text, message] : cases) {
    std::string error;
    EXPECT_FALSE(parse_json(text, &error)) << text;
    EXPECT_EQ(error, message) << text;
  }
  // The outermost value is depth 0: 65 nested arrays are the most it takes.
  std::string deep(66, '[');
  deep += std::string(66, ']');
  std::string error;
  EXPECT_FALSE(parse_json(deep, &error));
  EXPECT_NE(error.find("nesting too deep"), std::string::npos) << error;
  EXPECT_TRUE(parse_json(std::string(65, '[') + std::string(65, ']')));
}

}  // namespace
}  // namespace deepio::cli
