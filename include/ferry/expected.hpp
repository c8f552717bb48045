#pragma once
// A small expected<T, E = Error>: fallible functions return it, callers pass errors up with
// FERRY_TRY. Exceptions are kept for "cannot go on" and caught once in main.
#include <cassert>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace ferry {

// What kind of failure it was decides the exit code (docs/exit-codes.md).
enum class ErrorKind {
  usage,       // bad input; nothing was contacted (exit 2)
  unreachable, // connect, host key or authentication failure (exit 3)
  failed,      // anything else that went wrong during a run (exit 1)
};

// Why a host could not be reached or trusted (an ErrorKind::unreachable error): the fleet
// summary's classes and the JSON record's "failure" (docs/record.md). `none`: not said, which
// reads as `unreachable`.
enum class Unreached {
  none,
  unreachable, // no route, connection refused, a name that does not resolve, a proxy that failed
  refused,     // the SSH server closed the connection before or during key exchange
  timeout,     // no answer within the connect timeout
  host_key,    // host key unknown, changed or revoked
  auth,        // no key or method the server accepted
};

struct Error {
  ErrorKind kind = ErrorKind::failed;
  std::string message;
  Unreached unreached = Unreached::none;
};

// The error half of an Expected<T, E>; `Unexpected{error}` deduces E.
template <typename E = Error> struct Unexpected {
  E error;
};
template <typename E> Unexpected(E) -> Unexpected<E>;

template <typename... Args>
[[nodiscard]] Unexpected<Error> fail(ErrorKind kind, fmt::format_string<Args...> format,
                                     Args&&... args)
{
  return Unexpected<Error>{Error{kind, fmt::format(format, std::forward<Args>(args)...)}};
}

// A value of type T, or the error E that stopped it. E is ferry::Error everywhere but in thin
// wrappers of C libraries, which keep the library's own code (archive/sqlite.hpp).
template <typename T, typename E = Error> class [[nodiscard]] Expected {
public:
  Expected(T value) : m_state(std::in_place_index<0>, std::move(value)) {}
  Expected(Unexpected<E> u) : m_state(std::in_place_index<1>, std::move(u.error)) {}

  explicit operator bool() const { return m_state.index() == 0; }
  [[nodiscard]] bool has_value() const { return m_state.index() == 0; }

  T& value() &
  {
    assert(has_value());
    return std::get<0>(m_state);
  }
  const T& value() const&
  {
    assert(has_value());
    return std::get<0>(m_state);
  }
  T&& value() &&
  {
    assert(has_value());
    return std::get<0>(std::move(m_state));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const E& error() const&
  {
    assert(!has_value());
    return std::get<1>(m_state);
  }
  E&& error() &&
  {
    assert(!has_value());
    return std::get<1>(std::move(m_state));
  }

private:
  std::variant<T, E> m_state;
};

template <typename E> class [[nodiscard]] Expected<void, E> {
public:
  Expected() = default;
  Expected(Unexpected<E> u) : m_error(std::move(u.error)), m_ok(false) {}

  explicit operator bool() const { return m_ok; }
  [[nodiscard]] bool has_value() const { return m_ok; }
  const E& error() const&
  {
    assert(!m_ok);
    return m_error;
  }
  E&& error() &&
  {
    assert(!m_ok);
    return std::move(m_error);
  }

private:
  E m_error{};
  bool m_ok = true;
};

} // namespace ferry

// Returns the error of EXPR from the enclosing function; on success evaluates to nothing.
#define FERRY_TRY(expr)                                                                            \
  do {                                                                                             \
    auto&& ferry_try_result_ = (expr);                                                             \
    if (!ferry_try_result_)                                                                        \
      return ::ferry::Unexpected{std::move(ferry_try_result_).error()};                            \
  } while (false)

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)

// Assigns the value of EXPR to LHS, or returns its error. LHS is a declaration
// (`FERRY_TRY_ASSIGN(auto x, f())`) or any existing lvalue (`FERRY_TRY_ASSIGN(m_port, g())`).
#define FERRY_TRY_ASSIGN(lhs, expr)                                                                \
  FERRY_TRY_ASSIGN_IMPL_(FERRY_CONCAT_(ferry_try_assign_, __COUNTER__), lhs, expr)
#define FERRY_TRY_ASSIGN_IMPL_(tmp, lhs, expr)                                                     \
  auto&& tmp = (expr);                                                                             \
  if (!tmp)                                                                                        \
    return ::ferry::Unexpected{std::move(tmp).error()};                                            \
  lhs = std::move(tmp).value()
