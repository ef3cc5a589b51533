// Internal to cascade_server_common: turns SIGTERM/SIGINT into a callback on an ordinary thread.
// The handler only write()s one byte to a pipe (async-signal-safe); a watcher thread reads it
// and runs the callbacks. A second signal while draining exits the process at once, so a stuck
// drain can still be interrupted with Ctrl-C.
#pragma once

#include <functional>

namespace cascade::common::internal {

// Registers `on_signal`, installing the handlers with the first registration. Returns an id for
// RemoveShutdownCallback. Thread-safe. `on_signal` must not block: it runs on the watcher thread.
int AddShutdownCallback(std::function<void()> on_signal);
// Unregisters; with the last one gone, restores the previous handlers and joins the watcher.
void RemoveShutdownCallback(int id);

}  // namespace cascade::common::internal
