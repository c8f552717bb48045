// The C++ side of the launcher conformance table (test_launcher_conformance.py): ferry's own
// make_launcher, standby_script and parse_launcher_report, driven by JSON. Byte strings travel
// in hex, so any byte survives.
//   ferry_launcher_tool launchers DIR < {"NAME": SPEC, ...}  writes DIR/NAME.sh and DIR/standby.py
//   ferry_launcher_tool reports < {"NAME": "HEX", ...}       prints {"NAME": REPORT or null}
//   ferry_launcher_tool boot ENTRY TAG_SHA256                prints standby_boot_line's line
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ferry/remote/launcher.hpp"
#include "ferry/remote/standby_boot.hpp"
#include "ferry/util.hpp"

using nlohmann::json;

namespace {

std::string from_hex(const std::string& hex)
{
  if (hex.size() % 2 != 0) {
    throw std::invalid_argument("odd hex: " + hex);
  }
  std::string bytes;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return bytes;
}

// A spec's text fields are hex; the rest as LauncherSpec names them.
ferry::LauncherSpec launcher_spec(const json& in)
{
  ferry::LauncherSpec spec;
  spec.run_dir = from_hex(in.at("run_dir"));
  spec.job_file = from_hex(in.at("job_file"));
  spec.job_name = from_hex(in.at("job_name"));
  spec.interpreter = from_hex(in.at("interpreter"));
  spec.timeout_s = in.at("timeout_s");
  spec.grace_s = in.at("grace_s");
  spec.sentinel = from_hex(in.at("sentinel"));
  spec.end_marker = from_hex(in.at("end_marker"));
  spec.params = from_hex(in.at("params"));
  spec.result_frame_limit = in.at("result_frame_limit");
  spec.keep_run_dir = in.at("keep_run_dir");
  spec.job_sha256 = in.value("job_sha256", "");
  for (const auto& [name, value] : in.at("env").items()) {
    spec.env[name] = from_hex(value);
  }
  return spec;
}

void write_file(const std::string& path, std::string_view bytes)
{
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) {
    throw std::runtime_error("cannot write " + path);
  }
}

void write_launchers(const std::string& dir)
{
  const json specs = json::parse(std::cin);
  for (const auto& [name, spec] : specs.items()) {
    write_file(dir + "/" + name + ".sh", ferry::make_launcher(launcher_spec(spec)));
  }
  write_file(dir + "/standby.py", ferry::standby_script());
}

json report_json(std::string_view text)
{
  const auto report = ferry::parse_launcher_report(text);
  if (!report) {
    return nullptr;
  }
  static constexpr const char* causes[] = {"exit", "timeout", "stopped"};
  static constexpr const char* results[] = {"unknown", "none",      "file",   "fetch",
                                            "link",    "directory", "special"};
  return {{"code", report->code},
          {"cause", causes[static_cast<int>(report->cause)]},
          {"result", results[static_cast<int>(report->result)]},
          {"bytes", ferry::lower_hex(report->result_bytes)},
          {"removed", report->run_dir_removed},
          {"whole", ferry::is_whole_launcher_report(text)}};
}

void print_reports()
{
  const json texts = json::parse(std::cin);
  json out = json::object();
  for (const auto& [name, hex] : texts.items()) {
    out[name] = report_json(from_hex(hex));
  }
  std::cout << out.dump() << "\n";
}

} // namespace

int main(int argc, char** argv)
{
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "launchers" && argc == 3) {
      write_launchers(argv[2]);
    } else if (command == "reports" && argc == 2) {
      print_reports();
    } else if (command == "boot" && argc == 4) {
      std::cout << ferry::standby_boot_line(argv[2], argv[3]);
    } else {
      fmt::print(stderr, "usage: ferry_launcher_tool launchers DIR | reports (JSON on stdin)\n");
      return 2;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry_launcher_tool: {}\n", e.what());
    return 1;
  }
  return 0;
}
