// libssh, loaded when SSH is first needed rather than when ferry starts.
//
// Most ferry runs on a host whose connection a holder keeps (docs/persistence.md) never touch
// libssh in the ferry process: the holder does the SSH. Linking libssh would still make every
// start load it with its dependencies (libcrypto, the Kerberos libraries) and run its
// initialisation: measured on a 2-core VM, a held run took 116 ms back to back with libssh
// linked and 110 ms without, and the ferry process's CPU went from 29 to 22 ms. So ferry is not
// linked against libssh. Each libssh function ferry calls is defined here instead, with libssh's
// own prototype (its header is included, so a mismatch does not compile), and forwards to the
// function of the same name in libssh.so.4, which is opened and looked up (all functions at
// once) on the first call. ferry's code calls libssh as usual; a function used anywhere in
// ferry must be listed here or the link fails naming it.
#include "transport/ssh/libssh_loader.hpp"

#include <dlfcn.h>

#include <stdexcept>

#include <fmt/format.h>
#include <libssh/callbacks.h>
#include <libssh/libssh.h>
#include <libssh/sftp.h>

// X(return type, name, (parameters), (arguments)): every libssh function ferry calls.
#define FERRY_LIBSSH_FUNCTIONS(X)                                                                  \
  X(void, sftp_attributes_free, (sftp_attributes file), (file))                                    \
  X(char*, sftp_canonicalize_path, (sftp_session sftp, const char* path), (sftp, path))            \
  X(int, sftp_chmod, (sftp_session sftp, const char* file, mode_t mode), (sftp, file, mode))       \
  X(int, sftp_close, (sftp_file file), (file))                                                     \
  X(int, sftp_closedir, (sftp_dir dir), (dir))                                                     \
  X(void, sftp_free, (sftp_session sftp), (sftp))                                                  \
  X(sftp_attributes, sftp_fstat, (sftp_file file), (file))                                         \
  X(int, sftp_get_error, (sftp_session sftp), (sftp))                                              \
  X(int, sftp_init, (sftp_session sftp), (sftp))                                                   \
  X(sftp_attributes, sftp_lstat, (sftp_session session, const char* path), (session, path))        \
  X(int, sftp_mkdir, (sftp_session sftp, const char* directory, mode_t mode),                      \
    (sftp, directory, mode))                                                                       \
  X(sftp_session, sftp_new, (ssh_session session), (session))                                      \
  X(sftp_file, sftp_open, (sftp_session session, const char* file, int accesstype, mode_t mode),   \
    (session, file, accesstype, mode))                                                             \
  X(sftp_dir, sftp_opendir, (sftp_session session, const char* path), (session, path))             \
  X(ssize_t, sftp_read, (sftp_file file, void* buf, size_t count), (file, buf, count))             \
  X(sftp_attributes, sftp_readdir, (sftp_session session, sftp_dir dir), (session, dir))           \
  X(int, sftp_seek64, (sftp_file file, uint64_t new_offset), (file, new_offset))                   \
  X(int, sftp_rename, (sftp_session sftp, const char* original, const char* newname),              \
    (sftp, original, newname))                                                                     \
  X(int, sftp_rmdir, (sftp_session sftp, const char* directory), (sftp, directory))                \
  X(int, sftp_symlink, (sftp_session sftp, const char* target, const char* dest),                  \
    (sftp, target, dest))                                                                          \
  X(int, sftp_unlink, (sftp_session sftp, const char* file), (sftp, file))                         \
  X(int, sftp_utimes, (sftp_session sftp, const char* file, const struct timeval* times),          \
    (sftp, file, times))                                                                           \
  X(ssize_t, sftp_write, (sftp_file file, const void* buf, size_t count), (file, buf, count))      \
  X(int, ssh_blocking_flush, (ssh_session session, int timeout), (session, timeout))               \
  X(int, ssh_channel_close, (ssh_channel channel), (channel))                                      \
  X(void, ssh_channel_free, (ssh_channel channel), (channel))                                      \
  X(int, ssh_channel_get_exit_status, (ssh_channel channel), (channel))                            \
  X(int, ssh_channel_is_closed, (ssh_channel channel), (channel))                                  \
  X(int, ssh_channel_is_eof, (ssh_channel channel), (channel))                                     \
  X(int, ssh_channel_is_open, (ssh_channel channel), (channel))                                    \
  X(ssh_channel, ssh_channel_new, (ssh_session session), (session))                                \
  X(int, ssh_channel_open_session, (ssh_channel channel), (channel))                               \
  X(int, ssh_channel_poll, (ssh_channel channel, int is_stderr), (channel, is_stderr))             \
  X(int, ssh_channel_read_nonblocking,                                                             \
    (ssh_channel channel, void* dest, uint32_t count, int is_stderr),                              \
    (channel, dest, count, is_stderr))                                                             \
  X(int, ssh_channel_read_timeout,                                                                 \
    (ssh_channel channel, void* dest, uint32_t count, int is_stderr, int timeout_ms),              \
    (channel, dest, count, is_stderr, timeout_ms))                                                 \
  X(int, ssh_channel_request_exec, (ssh_channel channel, const char* cmd), (channel, cmd))         \
  X(int, ssh_channel_request_send_signal, (ssh_channel channel, const char* signum),               \
    (channel, signum))                                                                             \
  X(int, ssh_channel_write, (ssh_channel channel, const void* data, uint32_t len),                 \
    (channel, data, len))                                                                          \
  X(int, ssh_connect, (ssh_session session), (session))                                            \
  X(void, ssh_disconnect, (ssh_session session), (session))                                        \
  X(void, ssh_event_free, (ssh_event event), (event))                                              \
  X(void, ssh_free, (ssh_session session), (session))                                              \
  X(const char*, ssh_get_error, (void* error), (error))                                            \
  X(socket_t, ssh_get_fd, (ssh_session session), (session))                                        \
  X(const char*, ssh_get_serverbanner, (ssh_session session), (session))                           \
  X(int, ssh_get_server_publickey, (ssh_session session, ssh_key * key), (session, key))           \
  X(int, ssh_get_status, (ssh_session session), (session))                                         \
  X(int, ssh_is_connected, (ssh_session session), (session))                                       \
  X(ssh_key, ssh_key_dup, (const ssh_key key), (key))                                              \
  X(void, ssh_key_free, (ssh_key key), (key))                                                      \
  X(enum ssh_keytypes_e, ssh_key_type, (const ssh_key key), (key))                                 \
  X(enum ssh_keytypes_e, ssh_key_type_from_name, (const char* name), (name))                       \
  X(const char*, ssh_key_type_to_char, (enum ssh_keytypes_e type), (type))                         \
  X(void, ssh_knownhosts_entry_free, (struct ssh_knownhosts_entry * entry), (entry))               \
  X(ssh_session, ssh_new, (void), ())                                                              \
  X(int, ssh_options_set, (ssh_session session, enum ssh_options_e type, const void* value),       \
    (session, type, value))                                                                        \
  X(int, ssh_pki_copy_cert_to_privkey, (const ssh_key cert_key, ssh_key privkey),                  \
    (cert_key, privkey))                                                                           \
  X(int, ssh_pki_export_privkey_to_pubkey, (const ssh_key privkey, ssh_key* pkey),                 \
    (privkey, pkey))                                                                               \
  X(int, ssh_pki_export_pubkey_base64, (const ssh_key key, char** b64_key), (key, b64_key))        \
  X(int, ssh_pki_import_cert_file, (const char* filename, ssh_key* pkey), (filename, pkey))        \
  X(int, ssh_pki_import_privkey_file,                                                              \
    (const char* filename, const char* passphrase, ssh_auth_callback auth_fn, void* auth_data,     \
     ssh_key* pkey),                                                                               \
    (filename, passphrase, auth_fn, auth_data, pkey))                                              \
  X(int, ssh_pki_import_pubkey_base64,                                                             \
    (const char* b64_key, enum ssh_keytypes_e type, ssh_key* pkey), (b64_key, type, pkey))         \
  X(int, ssh_pki_import_pubkey_file, (const char* filename, ssh_key* pkey), (filename, pkey))      \
  X(int, ssh_remove_channel_callbacks, (ssh_channel channel, ssh_channel_callbacks cb),            \
    (channel, cb))                                                                                 \
  X(int, ssh_set_agent_socket, (ssh_session session, socket_t fd), (session, fd))                  \
  X(void, ssh_set_blocking, (ssh_session session, int blocking), (session, blocking))              \
  X(void, ssh_set_fd_towrite, (ssh_session session), (session))                                    \
  X(int, ssh_set_channel_callbacks, (ssh_channel channel, ssh_channel_callbacks cb),               \
    (channel, cb))                                                                                 \
  X(void, ssh_string_free_char, (char* s), (s))                                                    \
  X(int, ssh_userauth_agent, (ssh_session session, const char* username), (session, username))     \
  X(int, ssh_userauth_kbdint, (ssh_session session, const char* user, const char* submethods),     \
    (session, user, submethods))                                                                   \
  X(const char*, ssh_userauth_kbdint_getinstruction, (ssh_session session), (session))             \
  X(const char*, ssh_userauth_kbdint_getname, (ssh_session session), (session))                    \
  X(int, ssh_userauth_kbdint_getnprompts, (ssh_session session), (session))                        \
  X(const char*, ssh_userauth_kbdint_getprompt, (ssh_session session, unsigned int i, char* echo), \
    (session, i, echo))                                                                            \
  X(int, ssh_userauth_kbdint_setanswer, (ssh_session session, unsigned int i, const char* answer), \
    (session, i, answer))                                                                          \
  X(int, ssh_userauth_list, (ssh_session session, const char* username), (session, username))      \
  X(int, ssh_userauth_none, (ssh_session session, const char* username), (session, username))      \
  X(int, ssh_userauth_publickey,                                                                   \
    (ssh_session session, const char* username, const ssh_key privkey),                            \
    (session, username, privkey))                                                                  \
  X(int, ssh_userauth_try_publickey,                                                               \
    (ssh_session session, const char* username, const ssh_key pubkey),                             \
    (session, username, pubkey))                                                                   \
  X(const char*, ssh_version, (int req_version), (req_version))

namespace ferry::ssh {
namespace {

struct LibsshFunctions {
#define FERRY_LIBSSH_POINTER(ret, name, params, args) decltype(&::name) name = nullptr;
  FERRY_LIBSSH_FUNCTIONS(FERRY_LIBSSH_POINTER)
#undef FERRY_LIBSSH_POINTER
};

// The function `name` in `handle`; null (and `missing` set, unless it names another already)
// when the library lacks it.
void* look_up(void* handle, const char* name, const char*& missing)
{
  void* function = dlsym(handle, name);
  if (function == nullptr && missing == nullptr) {
    missing = name;
  }
  return function;
}

Expected<LibsshFunctions> open_libssh(const char* file)
{
  void* handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return fail(ErrorKind::failed,
                "SSH needs libssh ({}), which could not be loaded: {}; install libssh 0.10 (the "
                "Debian package libssh-4)",
                file, why != nullptr ? why : "unknown error");
  }
  LibsshFunctions functions;
  const char* missing = nullptr;
#define FERRY_LIBSSH_LOOKUP(ret, name, params, args)                                               \
  functions.name = reinterpret_cast<decltype(&::name)>(look_up(handle, #name, missing));
  FERRY_LIBSSH_FUNCTIONS(FERRY_LIBSSH_LOOKUP)
#undef FERRY_LIBSSH_LOOKUP
  if (missing != nullptr) {
    dlclose(handle);
    return fail(ErrorKind::failed,
                "the libssh in {} lacks {}, which ferry needs; install libssh 0.10 (the Debian "
                "package libssh-4)",
                file, missing);
  }
  return functions; // the handle stays open for the life of the process
}

// Opened once per process, on first use; a failure is kept and given to every later caller.
const Expected<LibsshFunctions>& loaded()
{
  static const Expected<LibsshFunctions> functions = open_libssh(k_libssh_file);
  return functions;
}

const LibsshFunctions& libssh_functions()
{
  const auto& result = loaded();
  if (!result) {
    // A libssh function called before any load_libssh() (which the connect path calls first):
    // "cannot go on", caught in main, which prints the message.
    throw std::runtime_error(result.error().message);
  }
  return *result;
}

} // namespace

Expected<void> load_libssh()
{
  const auto& result = loaded();
  if (!result) {
    return Unexpected{result.error()};
  }
  return {};
}

Expected<void> try_loading_libssh(const char* file)
{
  FERRY_TRY(open_libssh(file));
  return {};
}

} // namespace ferry::ssh

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer (FERRY_SANITIZE): libssh's thread-local variables now live in dynamic
// TLS (it is dlopen'ed), and GCC 12's sanitizer runtime misreads some dynamic TLS blocks in its
// __tls_get_addr interceptor (it takes a block at offset 16 of a page for a pre-2.25 glibc
// header), which crashes LeakSanitizer's tracer at exit now and then ("Tracer caught signal
// 11"; seen once in a CI run of `ferry check`). Not intercepting __tls_get_addr avoids it; the
// blocks are malloc'd by glibc and stay reachable from the thread's DTV, so what they point to
// is still seen by the leak check. Defaults only: ASAN_OPTIONS still overrides them. This file is
// in every binary that can load libssh, so the setting comes with it.
extern "C" const char* __asan_default_options()
{
  return "intercept_tls_get_addr=0";
}
#endif

#define FERRY_LIBSSH_FORWARD(ret, name, params, args)                                              \
  extern "C" ret name params                                                                       \
  {                                                                                                \
    return ferry::ssh::libssh_functions().name args;                                               \
  }
FERRY_LIBSSH_FUNCTIONS(FERRY_LIBSSH_FORWARD)
#undef FERRY_LIBSSH_FORWARD
#undef FERRY_LIBSSH_FUNCTIONS
