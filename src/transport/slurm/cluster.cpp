#include "transport/slurm/cluster.hpp"

#include <fmt/format.h>

#include "ferry/text.hpp"
#include "transport/slurm/frames.hpp"

namespace ferry::slurm {

namespace {

struct Said {
  std::optional<int> status;
  std::string text; // stdout and stderr together
};

// A fixed command on the login node (its tokens are shell-neutral), its output kept small.
Expected<Said> run_command(ssh::Remote& login, std::vector<std::string> argv, const StopToken& stop)
{
  ExecRequest request;
  request.argv = std::move(argv);
  request.output_cap = 1u << 20;
  request.deadline = std::chrono::seconds(60); // clients retry the controller for MessageTimeout
  request.stop = stop;
  FERRY_TRY_ASSIGN(auto outcome, login.exec(request));
  if (outcome.end != ExecEnd::exited) {
    return fail(ErrorKind::failed, "`{}` did not finish ({})", request.argv[0],
                outcome.end == ExecEnd::lost ? outcome.lost_reason : "stopped");
  }
  return Said{outcome.exit_code, outcome.out.bytes + outcome.err.bytes};
}

} // namespace

void cancel_job(ssh::Remote& login, const std::string& job_id)
{
  if (job_id.empty() || job_id.find_first_not_of("0123456789_") != std::string::npos) {
    return;
  }
  (void)run_command(login, {"scancel", job_id}, StopToken::make());
}

Expected<std::string> queue_state(ssh::Remote& login, const std::string& job_id,
                                  const StopToken& stop)
{
  if (job_id.empty() || job_id.find_first_not_of("0123456789_") != std::string::npos) {
    return fail(ErrorKind::failed, "no Slurm job id to ask squeue about ('{}')",
                terminal_safe(job_id));
  }
  FERRY_TRY_ASSIGN(
      const Said said,
      run_command(login, {"squeue", "-h", "-r", "-t", "all", "-j", job_id, "-O", "State"}, stop));
  if (said.status != 0) {
    if (said.text.find("Invalid job id") != std::string::npos) {
      return std::string();
    }
    return fail(ErrorKind::failed, "squeue: {}", terminal_safe(shorten(trim(said.text), 300)));
  }
  const std::string_view text = trim(said.text); // -O pads its column with spaces
  return std::string(trim(text.substr(0, text.find('\n'))));
}

Expected<void> ping_controller(ssh::Remote& login, std::string_view label, const StopToken& stop)
{
  auto said = run_command(login, {"scontrol", "ping"}, stop);
  if (!said) {
    return fail(ErrorKind::failed, "{}: cannot ask the Slurm controller: {}", label,
                said.error().message);
  }
  const std::string text(trim(said->text));
  if (said->status == 0 && text.find(" is UP") != std::string::npos) {
    return {};
  }
  if (said->status == 127 || text.find("not found") != std::string::npos) {
    return fail(ErrorKind::failed,
                "{}: `scontrol` is not on the login shell's PATH there; give the cluster's login "
                "node, where Slurm's commands (sbatch, squeue, scontrol) are installed",
                label);
  }
  return fail(ErrorKind::unreachable,
              "{}: the Slurm controller does not answer (`scontrol ping` says \"{}\"); check that "
              "slurmctld runs and that the login node can reach it",
              label, shorten(last_line(text), 300));
}

nlohmann::json parse_scontrol_records(std::string_view text)
{
  nlohmann::json records = nlohmann::json::array();
  for (const auto line : split_lines(text)) {
    nlohmann::json record = nlohmann::json::object();
    for (const auto word : split_words(line)) {
      const auto equals = word.find('=');
      if (equals != std::string_view::npos && equals > 0) {
        record[std::string(word.substr(0, equals))] = std::string(word.substr(equals + 1));
      }
    }
    if (!record.empty()) {
      records.push_back(std::move(record));
    }
  }
  return records;
}

nlohmann::json describe_cluster(ssh::Remote& login, const StopToken& stop)
{
  nlohmann::json cluster = nlohmann::json::object();
  if (auto version = run_command(login, {"scontrol", "--version"}, stop);
      version && version->status == 0) {
    const auto words = split_words(last_line(version->text));
    cluster["version"] = words.empty() ? "" : std::string(words.back());
  }
  if (auto said = run_command(login, {"scontrol", "-o", "show", "partition"}, stop);
      said && said->status == 0) {
    nlohmann::json partitions = nlohmann::json::array();
    for (const auto& record : parse_scontrol_records(said->text)) {
      partitions.push_back({{"name", record.value("PartitionName", "")},
                            {"default", record.value("Default", "NO") == "YES"},
                            {"state", record.value("State", "")},
                            {"nodes", record.value("Nodes", "")}});
    }
    cluster["partitions"] = std::move(partitions);
  }
  if (auto said = run_command(login, {"scontrol", "-o", "show", "node"}, stop);
      said && said->status == 0) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& record : parse_scontrol_records(said->text)) {
      nodes.push_back({{"name", record.value("NodeName", "")},
                       {"gres", record.value("Gres", "")},
                       {"partitions", record.value("Partitions", "")},
                       {"state", record.value("State", "")}});
    }
    cluster["nodes"] = std::move(nodes);
  }
  return cluster;
}

} // namespace ferry::slurm
