// Worker clients; see worker_pool.h.
#include "services/gateway/worker_pool.h"

#include <algorithm>

#include "common/log.h"

namespace cascade::gateway {

WorkerPool::WorkerPool(common::ClientChannelOptions channel_options,
                       std::vector<std::string> static_workers)
    : WorkerPool(
          [channel_options = std::move(channel_options)](
              const std::string& address) -> std::unique_ptr<WorkerClient> {
            auto channel = common::MakeChannel(address, channel_options);
            if (!channel.ok()) return nullptr;
            return NewGrpcWorkerClient(*channel);
          },
          std::move(static_workers)) {}

WorkerPool::WorkerPool(WorkerClientFactory factory, std::vector<std::string> static_workers)
    : factory_(std::move(factory)), static_workers_(std::move(static_workers)) {}

WorkerPool::~WorkerPool() {
  std::map<std::string, Entry> handles;
  {
    MutexLock lock(&mu_);
    handles.swap(handles_);
  }
  for (auto& [address, e] : handles) e.handle->client.reset();
}

std::shared_ptr<WorkerHandle> WorkerPool::Get(const std::string& address) {
  MutexLock lock(&mu_);
  const auto now = std::chrono::steady_clock::now();
  auto it = handles_.find(address);
  if (it != handles_.end()) {
    it->second.used_at = now;
    return it->second.handle;
  }
  std::unique_ptr<WorkerClient> client = factory_(address);
  if (client == nullptr) return nullptr;
  auto h = std::make_shared<WorkerHandle>();
  h->address = address;
  h->client = std::move(client);
  handles_[address] = Entry{h, now};
  return h;
}

void WorkerPool::Remember(const std::vector<Candidate>& live) {
  std::vector<std::shared_ptr<WorkerHandle>> gone;  // destroyed after the lock is released
  {
    MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    last_seen_.clear();
    for (const Candidate& c : live) {
      last_seen_[c.address] = c;
      if (auto it = handles_.find(c.address); it != handles_.end()) it->second.used_at = now;
    }
    for (auto it = handles_.begin(); it != handles_.end();) {
      const std::string& a = it->first;
      // use_count 1: no attempt holds it, and none can take it while mu_ is held (Get).
      const bool idle =
          it->second.handle.use_count() == 1 && last_seen_.count(a) == 0 &&
          std::find(static_workers_.begin(), static_workers_.end(), a) == static_workers_.end() &&
          now - it->second.used_at >= evict_after_;
      if (!idle) {
        ++it;
        continue;
      }
      gone.push_back(std::move(it->second.handle));
      it = handles_.erase(it);
    }
  }
  // A finished attempt's call may still be returning from OnDone: the client waits for it, here
  // (not on that call's thread), so the channel's last reference goes here (client_calls.h).
  for (std::shared_ptr<WorkerHandle>& h : gone) {
    common::LogInfo("worker_client_released", {{"worker", h->address}});
    h.reset();
  }
}

void WorkerPool::set_evict_after(std::chrono::steady_clock::duration d) {
  MutexLock lock(&mu_);
  evict_after_ = d;
}

std::vector<std::string> WorkerPool::Clients() {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [a, e] : handles_) out.push_back(a);
  return out;
}

std::vector<Candidate> WorkerPool::KnownWorkers() {
  MutexLock lock(&mu_);
  std::map<std::string, Candidate> all = last_seen_;
  for (const std::string& a : static_workers_) {
    if (!all.count(a)) all[a] = Candidate{a, a};
  }
  std::vector<Candidate> out;
  for (auto& [addr, c] : all) {
    c.matched_tokens = 0;
    auto h = handles_.find(addr);
    c.inflight = h == handles_.end() ? 0 : h->second.handle->inflight.load();
    out.push_back(c);
  }
  return out;
}

int32_t WorkerPool::Inflight(const std::string& address) {
  MutexLock lock(&mu_);
  auto it = handles_.find(address);
  return it == handles_.end() ? 0 : it->second.handle->inflight.load();
}

}  // namespace cascade::gateway
