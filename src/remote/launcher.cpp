#include "ferry/remote/launcher.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "remote/remote_scripts.hpp"

namespace ferry {

std::string sh_quote(std::string_view text)
{
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string fill_template(std::string_view script, const std::map<std::string, std::string>& fields)
{
  std::string out;
  out.reserve(script.size() + 512);
  std::size_t pos = 0;
  while (pos < script.size()) {
    const std::size_t at = script.find('@', pos);
    if (at == std::string_view::npos) {
      break;
    }
    const std::size_t close = script.find('@', at + 1);
    const auto field = close == std::string_view::npos
                           ? fields.end()
                           : fields.find(std::string(script.substr(at + 1, close - at - 1)));
    if (field == fields.end()) {
      out.append(script.substr(pos, at + 1 - pos));
      pos = at + 1;
      continue;
    }
    out.append(script.substr(pos, at - pos));
    out.append(field->second);
    pos = close + 1;
  }
  out.append(script.substr(pos));
  return out;
}

std::string_view remote_script(std::string_view file_name)
{
  for (const auto& file : remote_script_files()) {
    if (file.file_name == file_name) {
      return file.bytes;
    }
  }
  throw std::logic_error(fmt::format("no remote script {} was embedded", file_name));
}

std::string make_launcher(const LauncherSpec& spec)
{
  return fill_template(remote_script("launch.sh"),
                       {
                           {"run_dir", sh_quote(spec.run_dir)},
                           {"job_name", sh_quote(spec.job_name)},
                           {"sentinel", sh_quote(spec.sentinel)},
                           {"end_marker", sh_quote(spec.end_marker)},
                           {"interpreter", sh_quote(spec.interpreter)},
                           {"job_file", sh_quote(spec.job_file)},
                           {"timeout", std::to_string(spec.timeout_s)},
                           {"grace", std::to_string(spec.grace_s)},
                           {"timeout_marker", k_launcher_timeout_marker},
                           {"timeout_exit", std::to_string(k_launcher_timeout_exit)},
                           {"no_interp_prefix", k_launcher_no_interpreter_prefix},
                           {"no_interp_exit", std::to_string(k_launcher_no_interpreter_exit)},
                       });
}

} // namespace ferry
