#include "transport/ssh/auth.hpp"

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
};

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
    return fail(ErrorKind::unreachable,
                "{}: the server accepted {} for user {} but asks for more ({}); ferry "
                "authenticates with keys only",
                m_ctx.label, offered, m_ctx.user,
                methods_text(ssh_userauth_list(m_session, nullptr)));
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
  refused(id, std::move(outcome));
  return false;
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
  if ((static_cast<unsigned>(m_methods) & SSH_AUTH_METHOD_PUBLICKEY) == 0) {
    return fail(ErrorKind::unreachable,
                "{}: authentication failed for user {}: the server allows only {}; ferry "
                "authenticates with keys only",
                m_ctx.label, m_ctx.user, methods_text(m_methods));
  }
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
      return {};
    }
    i = end;
  }
  return all_refused();
}

} // namespace

Expected<void> authenticate(ssh_session session, Identities identities, const AuthContext& context)
{
  return Authenticator(session, std::move(identities), context).run();
}

} // namespace ferry::ssh
