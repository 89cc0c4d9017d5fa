// The weir CLI's client commands (`basin`, `stream`, `append`, `read`,
// `tail`) and `weir bench http`: registered on the CLI11 app by main, run after
// parsing.
#pragma once

#include <memory>
#include <optional>

namespace CLI {
class App;
}

namespace weir::cli {

struct ClientCommandsState;

// Owned by main, used on the main thread. Holds the parsed flags of every
// command it registered; Run executes the one the user named.
class ClientCommands {
 public:
  // Adds the client commands to `app` and `http` to `bench`.
  ClientCommands(CLI::App& app, CLI::App& bench);
  ~ClientCommands();
  ClientCommands(const ClientCommands&) = delete;
  ClientCommands& operator=(const ClientCommands&) = delete;

  // After parsing: the exit code of the command the user named (errors are
  // printed as one line on stderr), or nullopt if it was none of these.
  std::optional<int> Run();

 private:
  std::unique_ptr<ClientCommandsState> s_;
};

}  // namespace weir::cli
