// Helpers of the data/ tests: the message of an exception of an exact type.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace tg::test {

// Runs fn, expects exception E, and returns its message.
template <class E, class Fn>
std::string message_of(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace tg::test
