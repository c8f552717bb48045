#pragma once
// A move-only owner of a file descriptor, and a one-line deferred action.
#include <utility>

namespace ferry {

class Fd {
public:
  Fd() = default;
  explicit Fd(int fd) : m_fd(fd) {}
  Fd(Fd&& other) noexcept : m_fd(other.release()) {}
  Fd& operator=(Fd&& other) noexcept
  {
    if (this != &other) {
      reset(other.release());
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  [[nodiscard]] int get() const { return m_fd; }
  [[nodiscard]] explicit operator bool() const { return m_fd >= 0; }
  // Gives up ownership without closing.
  [[nodiscard]] int release() { return std::exchange(m_fd, -1); }
  void reset(int fd = -1);
  // Closes now and reports it: 0, or the errno of close(2) (a late write error shows here).
  [[nodiscard]] int close();

private:
  int m_fd = -1;
};

// Runs `action` when the scope ends, unless dismissed.
template <typename F> class [[nodiscard]] Defer {
public:
  explicit Defer(F action) : m_action(std::move(action)) {}
  Defer(const Defer&) = delete;
  Defer& operator=(const Defer&) = delete;
  ~Defer()
  {
    if (m_armed) {
      m_action();
    }
  }
  void dismiss() { m_armed = false; }

private:
  F m_action;
  bool m_armed = true;
};

} // namespace ferry
