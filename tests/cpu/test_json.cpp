// The JSON reader behind the safetensors header (core/json.h): values and escapes, errors that
// name the byte offset, nesting limits, exact integer sizes, duplicate keys, UTF-8.
#include <string>

#include "common/checkpoint_util.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

// ---- JSON -------------------------------------------------------------------------------

TEST(Json, ParsesValuesAndEscapes) {
  json::Value v = json::parse(R"( {"a": [1, -2.5e3, true, false, null], "b\"\\\/\n": "\u00e9\ud83d\ude00", "c": {}} )");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.members.size(), 3u);
  const json::Value* a = v.find("a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->items.size(), 5u);
  EXPECT_EQ(a->items[0].as_size("x"), 1);
  EXPECT_EQ(a->items[1].text, "-2.5e3");
  EXPECT_TRUE(a->items[2].boolean);
  EXPECT_EQ(a->items[4].kind, json::Value::Kind::null);
  EXPECT_EQ(v.members[1].first, "b\"\\/\n");
  EXPECT_EQ(v.members[1].second.text, "\xc3\xa9\xf0\x9f\x98\x80");  // é and an emoji, in UTF-8
  EXPECT_EQ(json::parse(json::quote("tab\there \"q\" \x01")).text, "tab\there \"q\" \x01");
}

TEST(Json, ErrorsNameTheByteOffset) {
  TG_EXPECT_ERROR(json::parse("{\"a\": [1, 2}"), "json", "at byte 11");
  TG_EXPECT_ERROR(json::parse("{\"a\": 1, \"a\": 2}"), "duplicate key \"a\"", "at byte 9");
  TG_EXPECT_ERROR(json::parse("{\"a\": tru}"), "invalid literal", "at byte 9");
  TG_EXPECT_ERROR(json::parse("{\"a\": \"x"), "missing closing quote");
  TG_EXPECT_ERROR(json::parse("{} x"), "expected end of input", "at byte 3");
  TG_EXPECT_ERROR(json::parse("[01]"), "at byte 2");
  TG_EXPECT_ERROR(json::parse("\"\\ud800\""), "surrogate");
  TG_EXPECT_ERROR(json::parse("[1,]", 100), "at byte 103");  // offsets of a slice of a file
}

TEST(Json, DeepNestingIsAnErrorNotACrash) {
  std::string deep(100000, '[');
  TG_EXPECT_ERROR(json::parse(deep), "nesting deeper");
}

TEST(Json, SizesMustBeNonNegativeIntegersIn64Bits) {
  EXPECT_EQ(json::parse("9223372036854775807").as_size("n"), INT64_MAX);
  TG_EXPECT_ERROR(json::parse("9223372036854775808").as_size("n"), "does not fit");
  TG_EXPECT_ERROR(json::parse("-1").as_size("n"), "non-negative integer");
  TG_EXPECT_ERROR(json::parse("1.0").as_size("n"), "non-negative integer");
  TG_EXPECT_ERROR(json::parse("\"1\"").as_size("n"), "must be a number");
}

TEST(Json, DuplicateKeysAreFoundInEveryObject) {
  TG_EXPECT_ERROR(json::parse(R"({"a": {"b": 1, "c": 2, "b": 3}})"), "duplicate key \"b\"", "at byte 23");
  // The same key in two objects is no duplicate; an escaped spelling of a key is one.
  EXPECT_EQ(json::parse(R"({"a": {"b": 1}, "c": {"b": 2}})").members.size(), 2u);
  TG_EXPECT_ERROR(json::parse(R"({"ab": 1, "\u0061b": 2})"), "duplicate key \"ab\"", "at byte 10");
}

TEST(Json, StringsMustBeUtf8) {
  TG_EXPECT_ERROR(json::parse("{\"\xff\": 1}"), "not valid UTF-8", "at byte 2");
  TG_EXPECT_ERROR(json::parse("[\"ok\", \"\xed\xa0\x80\"]"), "not valid UTF-8");  // an encoded surrogate
  size_t bad = 99;
  EXPECT_TRUE(json::valid_utf8("plain \xc3\xa9 \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(json::valid_utf8("ab\xc0\x80", &bad));  // overlong NUL
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(json::valid_utf8("\xed\xa0\x80"));          // surrogate U+D800
  EXPECT_FALSE(json::valid_utf8("\xf4\x90\x80\x80"));      // past U+10FFFF
  EXPECT_FALSE(json::valid_utf8("x\xe2\x82", &bad));       // truncated
  EXPECT_EQ(bad, 1u);
  EXPECT_FALSE(json::valid_utf8("\x80"));                  // a lone continuation byte
}

TEST(Json, BrokenUtf8CanBeMadeWritable) {
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(json::with_replacement_characters("plain \xc3\xa9 \xf0\x9f\x98\x80"), "plain \xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(json::with_replacement_characters("a\xff" "b"), "a" + fffd + "b");
  EXPECT_EQ(json::with_replacement_characters("x\xe2\x82"), "x" + fffd + fffd);  // truncated: each byte
  EXPECT_EQ(json::with_replacement_characters("\xed\xa0\x80"), fffd + fffd + fffd);  // a surrogate
  const std::string quoted = json::quote(json::with_replacement_characters("op\xc0\x80\"\n"));
  EXPECT_TRUE(json::valid_utf8(quoted));
  EXPECT_EQ(json::parse(quoted).text, "op" + fffd + fffd + "\"\n");
}

TEST(Json, NumbersAreExactIntegersOrRefused) {
  TG_EXPECT_ERROR(json::parse("-0").as_size("n"), "non-negative integer, found -0");
  TG_EXPECT_ERROR(json::parse("1e3").as_size("n"), "non-negative integer, found 1e3");
  TG_EXPECT_ERROR(json::parse("18446744073709551616").as_size("n"), "does not fit");  // 2^64
  TG_EXPECT_ERROR(json::parse(std::string(400, '9')).as_size("n"), "json");           // past a double
  TG_EXPECT_ERROR(json::parse("[1e400]"), "json", "at byte");
  // Offsets of values in any position, after escapes and whitespace.
  json::Value v = json::parse(R"({"k\"\\": [ 12 , "s\\\"" , -0 ], "t": true})", 100);
  EXPECT_EQ(v.offset, 100u);
  const json::Value& a = v.members[0].second;
  ASSERT_EQ(a.items.size(), 3u);
  EXPECT_EQ(a.items[0].offset, 112u);
  EXPECT_EQ(a.items[1].offset, 117u);
  EXPECT_EQ(a.items[2].text, "-0");
  EXPECT_EQ(a.items[2].offset, 127u);
  EXPECT_EQ(v.members[1].second.offset, 138u);
}
