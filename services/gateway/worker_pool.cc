// Worker channels; see worker_pool.h.
#include "services/gateway/worker_pool.h"

namespace cascade::gateway {

WorkerPool::WorkerPool(common::ClientChannelOptions channel_options,
                       std::vector<std::string> static_workers)
    : channel_options_(std::move(channel_options)), static_workers_(std::move(static_workers)) {}

std::shared_ptr<WorkerHandle> WorkerPool::Get(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(address);
  if (it != handles_.end()) return it->second;
  auto channel = common::MakeChannel(address, channel_options_);
  if (!channel.ok()) return nullptr;
  auto h = std::make_shared<WorkerHandle>();
  h->address = address;
  h->stub = cascade::v1::Worker::NewStub(*channel);
  handles_[address] = h;
  return h;
}

void WorkerPool::Remember(const std::vector<Candidate>& live) {
  std::lock_guard<std::mutex> lock(mu_);
  last_seen_.clear();
  for (const Candidate& c : live) last_seen_[c.address] = c;
}

std::vector<Candidate> WorkerPool::KnownWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(address);
  return it == handles_.end() ? 0 : it->second->inflight.load();
}

}  // namespace cascade::gateway
