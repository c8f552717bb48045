// Keyboard-interactive prompts on the user's terminal: /dev/tty, not stdin or stdout, so that a
// run whose output is piped (or --json) still asks its second factor where the user sees it.
#include <cerrno>
#include <mutex>
#include <optional>

#include <fcntl.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <fmt/format.h>

#include "ferry/fd.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"

namespace ferry {

namespace {

// Hosts of a fan-out that ask at once take turns: one host's prompts at a time.
std::mutex g_terminal;

void tty_say(int tty, const std::string& text)
{
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(tty, text.data() + done, text.size() - done);
    if (n < 0 && errno != EINTR) {
      return;
    }
    done += n > 0 ? static_cast<std::size_t>(n) : 0;
  }
}

// One line from the terminal, without its newline; nullopt on Ctrl-C or a closed terminal.
std::optional<std::string> tty_read_line(int tty)
{
  std::string line;
  while (!interrupt_requested()) {
    pollfd p{tty, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) {
      continue;
    }
    char c = 0;
    const ssize_t n = ::read(tty, &c, 1);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return std::nullopt;
    }
    if (c == '\n' || c == '\r') {
      return line;
    }
    line += c;
  }
  return std::nullopt;
}

// Echo goes off before the prompt is shown, so that nothing typed after it is echoed or dropped.
std::optional<std::string> tty_ask(int tty, const std::string& host, const PromptRound::Prompt& p)
{
  termios before{};
  const bool quiet = !p.echo && ::tcgetattr(tty, &before) == 0;
  if (quiet) {
    termios hidden = before;
    hidden.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    hidden.c_lflag |= ECHONL;
    ::tcsetattr(tty, TCSAFLUSH, &hidden);
  }
  const Defer restore([&] {
    if (quiet) {
      ::tcsetattr(tty, TCSANOW, &before);
    }
  });
  tty_say(tty, fmt::format("({}) {}", terminal_safe(host), terminal_safe(p.text)));
  return tty_read_line(tty);
}

Expected<std::vector<std::string>> ask_on_terminal(const PromptRound& round)
{
  const std::lock_guard lock(g_terminal);
  const Fd tty(::open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!tty) {
    return needs_interactive_login(round.host);
  }
  tty_say(tty.get(), fmt::format("ferry: {} asks for an interactive login (keyboard-interactive)\n",
                                 terminal_safe(round.host)));
  for (const std::string* text : {&round.name, &round.instruction}) {
    if (!text->empty()) {
      tty_say(tty.get(), terminal_safe(*text) + "\n");
    }
  }
  std::vector<std::string> answers;
  for (const auto& prompt : round.prompts) {
    auto answer = tty_ask(tty.get(), round.host, prompt);
    if (!answer) {
      return fail(ErrorKind::failed, "{}: interrupted while asking for its interactive login",
                  round.host);
    }
    answers.push_back(std::move(*answer));
  }
  return answers;
}

} // namespace

Unexpected<Error> needs_interactive_login(std::string_view host)
{
  return fail(ErrorKind::unreachable,
              "{} asks for an interactive login (keyboard-interactive); run `ferry connect {}` in "
              "a terminal first, then runs reuse that connection for --persist",
              host, host);
}

Prompter terminal_prompter()
{
  return ask_on_terminal;
}

} // namespace ferry
