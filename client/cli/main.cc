// tensorctl: a command-line client of the tensord broker. This file is its command table:
// the flags and commands CLI11 parses, and which function (commands.h) runs each.
//
//   tensorctl [--socket PATH] [--trusted-daemon-uid UID]... [--json] COMMAND
//     status | queues | top [-d S] [-n N] | health [--service S] [--timeout S] | ls [PREFIX]
//     | stat NAME | put NAME FILE.npy | get NAME [-o FILE.npy] [--wait SECONDS]
//     | rm NAME|PREFIX/ | watch [PREFIX]
//
// Human tables by default, --json for scripts (one JSON document, or one JSON object per
// line for `watch` and `top`). Any error prints exactly one line on stderr, "tensorctl:
// <what>: <status message>", and exits non-zero: 2 for a usage error, 1 for anything else.
// tensorctl is a plain user of the public client API (tensord/client.h); only `health`
// speaks gRPC itself, to the standard grpc.health.v1 service.
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli/command_support.h"
#include "client/cli/commands.h"
#include "common/names.h"
#include "tensord_build_info.h"  // generated: cmake/TensordBuildInfo.cmake

namespace tensord::cli {
namespace {

// Why no command ran (the first word CLI11 did not take, or nothing given), and the commands.
std::string NoCommandText(const CLI::App& app) {
  std::string commands;
  for (const CLI::App* command : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands += (commands.empty() ? "" : ", ") + command->get_name();
  }
  const std::vector<std::string> extra = app.remaining();
  std::string what = "no command given";
  if (!extra.empty()) {
    what = (extra.front().starts_with('-') ? "unknown option " : "unknown command ") +
           common::QuoteForError(extra.front());
  }
  return what + " (commands: " + commands + "; see tensorctl --help)";
}

int Run(int argc, char** argv) {
  CLI::App app{"tensorctl: inspect and use a tensord broker"};
  app.name("tensorctl");
  GlobalFlags g;
  app.add_option("--socket", g.socket, "broker socket (default: $TENSORD_SOCKET, the per-user "
                                       "socket, or /run/tensord/tensord.sock)");
  app.add_option("--trusted-daemon-uid", g.trusted_daemon_uids,
                 "a uid besides root and yours that the daemon may run as (repeatable; default: "
                 "$TENSORD_TRUSTED_DAEMON_UIDS)")
      ->check(CLI::Range(uint32_t{0}, uint32_t{UINT32_MAX - 1}));
  app.add_flag("--json", g.json, "machine-readable output");
  app.set_version_flag("--version", "tensorctl " TENSORD_VERSION_LINE,
                       "print the version, the commit built and the memory backends, and exit");
  app.require_subcommand(1, 1);
  app.fallthrough();  // --socket and --json also after the command

  auto* status = app.add_subcommand("status", "broker memory use, limits and counts");
  auto* queues = app.add_subcommand("queues", "bounded work queues: depth, tensors in each, waiting producers and takers");
  std::string ls_prefix;
  auto* ls = app.add_subcommand("ls", "list bound names");
  ls->add_option("PREFIX", ls_prefix, "only names under this prefix");
  std::string stat_name;
  auto* stat = app.add_subcommand("stat", "everything about one tensor, with its lease holders");
  stat->add_option("NAME", stat_name)->required();
  std::string put_name, put_file;
  auto* put = app.add_subcommand("put", "publish a .npy file under NAME");
  put->add_option("NAME", put_name)->required();
  put->add_option("FILE", put_file, ".npy file")->required();
  std::string get_name, get_out;
  std::optional<double> get_wait;
  auto* get = app.add_subcommand("get", "acquire NAME; write it as .npy with -o");
  get->add_option("NAME", get_name)->required();
  get->add_option("-o,--output", get_out, "write the tensor to this .npy file");
  get->add_option("--wait", get_wait, "wait up to SECONDS for the name to appear (inf: forever)");
  std::string rm_name;
  auto* rm = app.add_subcommand("rm", "unbind NAME, or every name under PREFIX/ (a trailing /)");
  rm->add_option("NAME", rm_name, "a name, or a prefix ending in / (every name under it)")->required();
  std::string watch_prefix;
  auto* watch = app.add_subcommand("watch", "print binding changes until Ctrl-C");
  watch->add_option("PREFIX", watch_prefix, "only names under this prefix");

  double top_interval = 1;
  uint64_t top_iterations = 0;
  auto* top = app.add_subcommand("top", "live view of the broker and its sessions by memory held, with rates");
  top->add_option("-d,--interval", top_interval, "seconds between refreshes (default 1)")->check(CLI::PositiveNumber);
  top->add_option("-n,--iterations", top_iterations, "stop after N refreshes (default: until Ctrl-C)");
  std::string health_service;
  double health_timeout = 5;
  auto* health = app.add_subcommand("health", "ask the daemon's gRPC health service (no session); exit 0 when SERVING");
  health->add_option("--service", health_service, "a service to ask about (default: the server as a whole)");
  health->add_option("--timeout", health_timeout, "seconds to wait for the answer (default 5)")
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Without a command, CLI11 only says one is required; name what was given instead.
    if (app.get_subcommands().empty()) return Fail("usage", NoCommandText(app), kExitUsage);
    return Fail("usage", std::string(e.what()) + " (see tensorctl --help)", kExitUsage);
  }

  if (health->parsed()) return CmdHealth(g, health_service, health_timeout);
  Result<std::unique_ptr<Client>> client = ConnectFromFlags(g);
  if (!client.ok()) return Fail("connect", client.status());
  Client& c = **client;
  if (status->parsed()) return CmdStatus(c, g);
  if (queues->parsed()) return CmdQueues(c, g);
  if (ls->parsed()) return CmdLs(c, g, ls_prefix);
  if (stat->parsed()) return CmdStat(c, g, stat_name);
  if (put->parsed()) return CmdPut(c, g, put_name, put_file);
  if (get->parsed()) return CmdGet(c, g, get_name, get_out, get_wait);
  if (rm->parsed()) return CmdRm(c, g, rm_name);
  if (watch->parsed()) return CmdWatch(c, g, watch_prefix);
  if (top->parsed()) return CmdTop(c, g, top_interval, top_iterations);
  return Fail("usage", "no command given (see tensorctl --help)", kExitUsage);
}

}  // namespace
}  // namespace tensord::cli

int main(int argc, char** argv) {
  try {
    return tensord::cli::Run(argc, argv);
  } catch (const std::exception& e) {
    return tensord::cli::Fail("error", e.what());
  }
}
