#include "transport/ssh/auth.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "ferry/text.hpp"

namespace ferry::ssh {

namespace {

std::string methods_text(int methods)
{
  std::string out;
  for (const auto& [bit, name] : {std::pair{SSH_AUTH_METHOD_PUBLICKEY, "publickey"},
                                  {SSH_AUTH_METHOD_PASSWORD, "password"},
                                  {SSH_AUTH_METHOD_INTERACTIVE, "keyboard-interactive"},
                                  {SSH_AUTH_METHOD_HOSTBASED, "hostbased"},
                                  {SSH_AUTH_METHOD_GSSAPI_MIC, "gssapi-with-mic"}}) {
    if ((static_cast<unsigned>(methods) & bit) != 0) {
      out += (out.empty() ? "" : ",") + std::string(name);
    }
  }
  return out.empty() ? "none" : out;
}

class Authenticator {
public:
  Authenticator(ssh_session session, Identities identities, const AuthContext& context)
      : m_session(session), m_ids(std::move(identities)), m_ctx(context)
  {
  }

  Expected<void> run();

private:
  Expected<int> call(const std::function<int()>& step);
  Expected<bool> offer_file_key(const Identity& id);
  Expected<bool> offer_through_agent(std::size_t first, std::size_t end);
  Expected<int> offer_from_file(const Identity& id, std::string& outcome);
  Expected<void> check_answer(int rc, const std::string& offered);
  Expected<bool> offer_keys();
  Expected<void> after_keys();
  Expected<void> keyboard_interactive();
  Expected<void> answer_round();
  Unexpected<Error> answers_not_accepted(int rc);
  void refused(const Identity& id, std::string outcome);
  Unexpected<Error> ended_by_server(const std::string& offered) const;
  Unexpected<Error> all_refused() const;
  std::string tried_text() const;
  void log(std::string line) const
  {
    if (m_ctx.log) {
      m_ctx.log(std::move(line));
    }
  }

  ssh_session m_session;
  Identities m_ids;
  const AuthContext& m_ctx;
  std::unique_ptr<AgentRelay> m_relay;
  std::vector<std::string> m_tried; // one "KEY (TYPE FP): outcome" per key offered
  int m_methods = 0;
  bool m_partial = false; // a key was accepted, the server asks for more
};

constexpr unsigned k_keyboard_interactive = SSH_AUTH_METHOD_INTERACTIVE;
// PAM may send a few rounds (a notice, then the question); more is a server that never ends.
constexpr int k_max_rounds = 8;

Expected<int> Authenticator::call(const std::function<int()>& step)
{
  const Stepped done = step_until_done(m_session, m_ctx.pace, SSH_AUTH_AGAIN, step);
  if (done.waited == Waited::stopped) {
    return fail(ErrorKind::failed, "{}: interrupted while authenticating", m_ctx.label);
  }
  if (done.waited == Waited::timed_out) {
    return fail(ErrorKind::unreachable,
                "{}: the server did not answer within {} s while authenticating user {}",
                m_ctx.label, m_ctx.pace.timeout_s, m_ctx.user);
  }
  return done.rc;
}

std::string Authenticator::tried_text() const
{
  std::string out;
  for (const auto& line : m_tried) {
    out += (out.empty() ? "" : "; ") + line;
  }
  return out;
}

Unexpected<Error> Authenticator::ended_by_server(const std::string& offered) const
{
  const std::string why = terminal_safe(ssh_get_error(m_session));
  const bool too_many = why.find("Too many authentication failures") != std::string::npos;
  return fail(ErrorKind::unreachable,
              "{}: authentication failed for user {}: the server closed the connection while "
              "ferry offered {} ({}){}{}{}",
              m_ctx.label, m_ctx.user, offered, why,
              m_tried.empty() ? "" : "; before it: ", tried_text(),
              too_many ? ". The server allows fewer attempts (MaxAuthTries) than the keys "
                         "offered: name the right key with --identity FILE or IdentityFile, and "
                         "set IdentitiesOnly yes"
                       : "");
}

Unexpected<Error> Authenticator::all_refused() const
{
  std::string notes;
  for (const auto& note : m_ids.notes) {
    notes += "; " + note;
  }
  if (m_tried.empty()) {
    return fail(ErrorKind::unreachable,
                "{}: authentication failed for user {}: no key to offer{}. Name one with "
                "--identity FILE or IdentityFile, or load it into ssh-agent",
                m_ctx.label, m_ctx.user, notes);
  }
  return fail(ErrorKind::unreachable,
              "{}: authentication failed for user {}: Permission denied ({}). Keys offered: "
              "{}{}. Check that one of them is in the user's authorized_keys on the host (or "
              "that the host trusts the certificate's CA), or name the right key with "
              "--identity FILE or IdentityFile",
              m_ctx.label, m_ctx.user, methods_text(m_methods), tried_text(), notes);
}

// Keys that sign through the agent go to libssh's ssh_userauth_agent together, as many in a row
// as the order allows: libssh 0.10 leaks its previous key list each time that call starts over.
Expected<bool> Authenticator::offer_through_agent(std::size_t first, std::size_t end)
{
  if (!m_relay && !m_ids.agent) {
    return false;
  }
  if (!m_relay) {
    m_relay = std::make_unique<AgentRelay>(std::move(*m_ids.agent));
    m_ids.agent.reset();
    ssh_set_agent_socket(m_session, m_relay->release_libssh_end());
  }
  std::vector<AgentRelay::Offer> offers;
  std::string labels;
  for (std::size_t i = first; i < end; ++i) {
    const Identity& id = m_ids.offered[i];
    log(fmt::format("offering {} {} {} through the agent", id.label, id.type, id.fingerprint));
    offers.push_back({id.blob, id.agent_blob});
    labels += (labels.empty() ? "" : ", ") + id.label;
  }
  m_relay->offer(std::move(offers));
  FERRY_TRY_ASSIGN(const int rc, call([this] { return ssh_userauth_agent(m_session, nullptr); }));
  if (rc == SSH_AUTH_SUCCESS) {
    const std::string used = m_relay->last_signed();
    for (std::size_t i = first; i < end; ++i) {
      if (m_ids.offered[i].blob == used) {
        log(fmt::format("authenticated as {} with {}", m_ctx.user, m_ids.offered[i].label));
      }
    }
    return true;
  }
  FERRY_TRY(check_answer(rc, labels));
  if (m_partial) {
    return true;
  }
  for (std::size_t i = first; i < end; ++i) {
    refused(m_ids.offered[i], "refused");
  }
  return false;
}

Expected<void> Authenticator::check_answer(int rc, const std::string& offered)
{
  if (rc == SSH_AUTH_ERROR) {
    return ended_by_server(offered);
  }
  if (rc == SSH_AUTH_PARTIAL) {
    m_partial = true;
    m_methods = ssh_userauth_list(m_session, nullptr);
    log(fmt::format("the server accepted {} and asks for more: {}", offered,
                    methods_text(m_methods)));
  }
  return {};
}

void Authenticator::refused(const Identity& id, std::string outcome)
{
  if (!id.doubts.empty()) {
    outcome += " (" + id.doubts + ")";
  }
  log(fmt::format("{}: {}", id.label, outcome));
  m_tried.push_back(fmt::format("{} ({} {}): {}", id.label, id.type, id.fingerprint, outcome));
}

Expected<int> Authenticator::offer_from_file(const Identity& id, std::string& outcome)
{
  FERRY_TRY_ASSIGN(const int rc, call([this, &id] {
                     return ssh_userauth_try_publickey(m_session, nullptr, id.public_key.get());
                   }));
  if (rc != SSH_AUTH_SUCCESS) {
    return rc;
  }
  if (!id.private_key) {
    outcome = "the server would accept it, but " + id.problem;
    return SSH_AUTH_DENIED;
  }
  FERRY_TRY_ASSIGN(const int signed_rc, call([this, &id] {
                     return ssh_userauth_publickey(m_session, nullptr, id.private_key.get());
                   }));
  if (signed_rc == SSH_AUTH_DENIED) {
    outcome = "the server accepted the key but refused its signature";
  }
  return signed_rc;
}

Expected<bool> Authenticator::offer_file_key(const Identity& id)
{
  log(fmt::format("offering {} {} {}", id.label, id.type, id.fingerprint));
  std::string outcome = "refused";
  FERRY_TRY_ASSIGN(const int rc, offer_from_file(id, outcome));
  if (rc == SSH_AUTH_SUCCESS) {
    log(fmt::format("authenticated as {} with {}", m_ctx.user, id.label));
    return true;
  }
  FERRY_TRY(check_answer(rc, id.label));
  if (m_partial) {
    return true;
  }
  refused(id, std::move(outcome));
  return false;
}

// Whether the keys finished it (or, m_partial, got as far as the server's next method).
Expected<bool> Authenticator::offer_keys()
{
  const auto& ids = m_ids.offered;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t end = i + 1;
    bool done = false;
    if (ids[i].agent_blob.empty()) {
      FERRY_TRY_ASSIGN(done, offer_file_key(ids[i]));
    } else {
      while (end < ids.size() && !ids[end].agent_blob.empty()) {
        ++end;
      }
      FERRY_TRY_ASSIGN(done, offer_through_agent(i, end));
    }
    if (done) {
      return true;
    }
    i = end;
  }
  return false;
}

// The keys did not finish it: keyboard-interactive when the server offers it. With nobody to
// answer, a key the server refused is the likelier problem, so its message comes first.
Expected<void> Authenticator::after_keys()
{
  const bool interactive = (static_cast<unsigned>(m_methods) & k_keyboard_interactive) != 0;
  if (interactive && (m_ctx.prompt || m_partial)) {
    return keyboard_interactive();
  }
  if (m_partial) {
    return fail(ErrorKind::unreachable,
                "{}: the server accepted a key for user {} but asks for more ({}); ferry "
                "authenticates with keys and keyboard-interactive only",
                m_ctx.label, m_ctx.user, methods_text(m_methods));
  }
  return all_refused();
}

Unexpected<Error> Authenticator::answers_not_accepted(int rc)
{
  if (rc == SSH_AUTH_ERROR) {
    return ended_by_server("the answers to its keyboard-interactive prompts");
  }
  if (rc == SSH_AUTH_PARTIAL) {
    return fail(ErrorKind::unreachable,
                "{}: the server took the keyboard-interactive answers for user {} but asks for "
                "more ({}), which ferry cannot give",
                m_ctx.label, m_ctx.user, methods_text(ssh_userauth_list(m_session, nullptr)));
  }
  return fail(ErrorKind::unreachable,
              "{}: authentication failed for user {}: the server did not accept the answers to "
              "its keyboard-interactive prompts (a wrong or expired code?); run again to answer "
              "anew",
              m_ctx.label, m_ctx.user);
}

// One round's prompts to the prompter, its answers to the server; never logged.
Expected<void> Authenticator::answer_round()
{
  PromptRound round;
  round.host = m_ctx.label;
  const auto text = [](const char* c) { return std::string(c != nullptr ? c : ""); };
  round.name = text(ssh_userauth_kbdint_getname(m_session));
  round.instruction = text(ssh_userauth_kbdint_getinstruction(m_session));
  const int count = std::max(0, ssh_userauth_kbdint_getnprompts(m_session));
  for (int i = 0; i < count; ++i) {
    char echo = 0;
    const char* prompt = ssh_userauth_kbdint_getprompt(m_session, static_cast<unsigned>(i), &echo);
    round.prompts.push_back({text(prompt), echo != 0});
  }
  log(fmt::format("the server asks {} keyboard-interactive question(s)", count));
  FERRY_TRY_ASSIGN(auto answers, m_ctx.prompt(round));
  if (answers.size() != round.prompts.size()) {
    return fail(ErrorKind::failed, "{}: {} answers to {} keyboard-interactive prompts", m_ctx.label,
                answers.size(), round.prompts.size());
  }
  for (std::size_t i = 0; i < answers.size(); ++i) {
    ssh_userauth_kbdint_setanswer(m_session, static_cast<unsigned>(i), answers[i].c_str());
    std::fill(answers[i].begin(), answers[i].end(), '\0');
  }
  return {};
}

// One set of answers per connect: a wrong one is not asked again.
Expected<void> Authenticator::keyboard_interactive()
{
  if (!m_ctx.prompt && !m_ctx.batch_mode.empty()) {
    // `ferry connect` with the same config would not prompt either: say what stops it.
    return fail(ErrorKind::unreachable,
                "{} asks for an interactive login (keyboard-interactive), and BatchMode yes ({}) "
                "rules out prompts; run `ferry connect {}` in a terminal first with BatchMode off "
                "for it (--ssh-config naming a config without it), then runs reuse that "
                "connection for --persist",
                m_ctx.label, m_ctx.batch_mode, m_ctx.label);
  }
  if (!m_ctx.prompt) {
    return needs_interactive_login(m_ctx.label);
  }
  log("trying keyboard-interactive");
  const auto step = [this] { return ssh_userauth_kbdint(m_session, nullptr, nullptr); };
  FERRY_TRY_ASSIGN(int rc, call(step));
  for (int round = 0; rc == SSH_AUTH_INFO && round < k_max_rounds; ++round) {
    FERRY_TRY(answer_round());
    FERRY_TRY_ASSIGN(rc, call(step));
  }
  if (rc != SSH_AUTH_SUCCESS) {
    return answers_not_accepted(rc);
  }
  log(fmt::format("authenticated as {} with keyboard-interactive", m_ctx.user));
  return {};
}

Expected<void> Authenticator::run()
{
  FERRY_TRY_ASSIGN(const int none, call([this] { return ssh_userauth_none(m_session, nullptr); }));
  if (none == SSH_AUTH_SUCCESS) {
    return {};
  }
  if (none == SSH_AUTH_ERROR) {
    return fail(ErrorKind::unreachable, "{}: authentication failed for user {}: {}", m_ctx.label,
                m_ctx.user, terminal_safe(ssh_get_error(m_session)));
  }
  m_methods = ssh_userauth_list(m_session, nullptr);
  log(fmt::format("the server allows: {}", methods_text(m_methods)));
  const auto methods = static_cast<unsigned>(m_methods);
  if ((methods & (SSH_AUTH_METHOD_PUBLICKEY | k_keyboard_interactive)) == 0) {
    return fail(ErrorKind::unreachable,
                "{}: authentication failed for user {}: the server allows only {}; ferry "
                "authenticates with keys and keyboard-interactive only",
                m_ctx.label, m_ctx.user, methods_text(m_methods));
  }
  if ((methods & SSH_AUTH_METHOD_PUBLICKEY) == 0) {
    return keyboard_interactive();
  }
  FERRY_TRY_ASSIGN(const bool done, offer_keys());
  if (done && !m_partial) {
    return {};
  }
  return after_keys();
}

} // namespace

Expected<void> authenticate(ssh_session session, Identities identities, const AuthContext& context)
{
  return Authenticator(session, std::move(identities), context).run();
}

} // namespace ferry::ssh
