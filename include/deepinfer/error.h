// Errors: one exception type a user can catch, with messages that name the problem and the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace deepinfer {

// Every error the engine raises. The message says what is wrong and what to do about it.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective missed its deadline (DEEPINFER_COMM_TIMEOUT_S): a peer hung or died.
class CommTimeout : public Error {
 public:
  using Error::Error;
};

// A DI_CHECK failed: an internal assertion, i.e. a bug, not a user's mistake. Its message names
// the condition and the source line. Errors a user can fix are thrown with DI_FAIL instead (both in
// src/core/check.h), and say what is wrong and what to do without pointing into the source.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace deepinfer
