#pragma once
// Move-only owners for libssh's C handles.
#include <memory>

#include <libssh/libssh.h>
#include <libssh/sftp.h>

namespace ferry::ssh {

struct SessionFree {
  // Sends SSH's disconnect message when it cannot block, then frees the session
  // (src/transport/ssh/ssh_session.cpp).
  void operator()(ssh_session s) const;
};
struct SftpFree {
  void operator()(sftp_session s) const { sftp_free(s); }
};
struct ChannelFree {
  void operator()(ssh_channel c) const { ssh_channel_free(c); }
};
struct KeyFree {
  void operator()(ssh_key k) const { ssh_key_free(k); }
};
struct EventFree {
  void operator()(ssh_event e) const { ssh_event_free(e); }
};
struct FileClose {
  void operator()(sftp_file f) const { sftp_close(f); }
};
struct DirClose {
  void operator()(sftp_dir d) const { sftp_closedir(d); }
};
struct AttributesFree {
  void operator()(sftp_attributes a) const { sftp_attributes_free(a); }
};
struct CharFree {
  void operator()(char* p) const { ssh_string_free_char(p); }
};
struct EntryFree {
  void operator()(ssh_knownhosts_entry* e) const { ssh_knownhosts_entry_free(e); }
};

using Session = std::unique_ptr<ssh_session_struct, SessionFree>;
using Sftp = std::unique_ptr<sftp_session_struct, SftpFree>;
using Channel = std::unique_ptr<ssh_channel_struct, ChannelFree>;
using Key = std::unique_ptr<ssh_key_struct, KeyFree>;
using Event = std::unique_ptr<ssh_event_struct, EventFree>;
using File = std::unique_ptr<sftp_file_struct, FileClose>;
using Dir = std::unique_ptr<sftp_dir_struct, DirClose>;
using Attributes = std::unique_ptr<sftp_attributes_struct, AttributesFree>;
using CString = std::unique_ptr<char, CharFree>;
using KnownHostsEntry = std::unique_ptr<ssh_knownhosts_entry, EntryFree>;

} // namespace ferry::ssh
