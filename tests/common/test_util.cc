// Helpers for the common/ tests: see test_util.h.
#include "tests/common/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace cascade::common::testing {

class PacedReactor final : public grpc::ServerWriteReactor<cascade::v2::GenerateResponse> {
 public:
  explicit PacedReactor(PacedStreamService* service) : service_(service) {
    thread_ = std::thread([this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_done_ = true;
    write_ok_ = ok;
    cv_.notify_all();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  void OnDone() override {
    // gRPC may run OnDone inline inside Finish() on our own writer thread.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  void Run() {
    for (int i = 0; i < service_->messages_; ++i) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoNanoseconds(service_->interval_),
                   [this] { return cancelled_; });
      if (cancelled_) break;
      write_done_ = false;
      lock.unlock();
      StartWrite(&response_);
      lock.lock();
      cv_.wait(lock, [this] { return write_done_; });
      if (!write_ok_) break;
    }
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled = cancelled_ || !write_ok_;
    }
    if (cancelled) service_->calls_cancelled_++;
    Finish(cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  PacedStreamService* const service_;
  cascade::v2::GenerateResponse response_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_done_ = false;
  bool write_ok_ = true;
  bool cancelled_ = false;
  std::thread thread_;
};

grpc::ServerWriteReactor<cascade::v2::GenerateResponse>* PacedStreamService::Generate(
    grpc::CallbackServerContext* context, const cascade::v2::GenerateRequest* request) {
  calls_started_++;
  return new PacedReactor(this);
}

int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         grpc::health::v1::HealthCheckResponse::ServingStatus* status_out,
                         absl::Duration timeout) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (status_out != nullptr) *status_out = response.status();
  return status;
}

}  // namespace cascade::common::testing
