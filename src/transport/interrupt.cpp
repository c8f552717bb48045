#include <atomic>

#include "ferry/transport.hpp"

namespace ferry {

namespace {
std::atomic<bool> g_interrupted{false};
} // namespace

bool interrupt_requested()
{
  return g_interrupted.load(std::memory_order_relaxed);
}

void request_interrupt()
{
  g_interrupted.store(true, std::memory_order_relaxed);
}

} // namespace ferry
