// Worker clients; see worker_pool.h.
#include "services/gateway/worker_pool.h"

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
  std::map<std::string, std::shared_ptr<WorkerHandle>> handles;
  {
    MutexLock lock(&mu_);
    handles.swap(handles_);
  }
  for (auto& [address, h] : handles) h->client.reset();
}

std::shared_ptr<WorkerHandle> WorkerPool::Get(const std::string& address) {
  MutexLock lock(&mu_);
  auto it = handles_.find(address);
  if (it != handles_.end()) return it->second;
  std::unique_ptr<WorkerClient> client = factory_(address);
  if (client == nullptr) return nullptr;
  auto h = std::make_shared<WorkerHandle>();
  h->address = address;
  h->client = std::move(client);
  handles_[address] = h;
  return h;
}

void WorkerPool::Remember(const std::vector<Candidate>& live) {
  MutexLock lock(&mu_);
  last_seen_.clear();
  for (const Candidate& c : live) last_seen_[c.address] = c;
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
    c.inflight = h == handles_.end() ? 0 : h->second->inflight.load();
    out.push_back(c);
  }
  return out;
}

int32_t WorkerPool::Inflight(const std::string& address) {
  MutexLock lock(&mu_);
  auto it = handles_.find(address);
  return it == handles_.end() ? 0 : it->second->inflight.load();
}

}  // namespace cascade::gateway
