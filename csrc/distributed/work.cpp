// The Work wrappers of collectives on neuron tensors, and the coalescing
// window.
#include "distributed/work.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <chrono>
#include <thread>
#include <unordered_map>

namespace neuron {

at::Tensor to_neuron(const at::Tensor& t, const ViewMap& map) {
  if (!t.defined()) return t;
  for (const auto& [impl, n] : map)
    if (impl == t.unsafeGetTensorImpl()) return n;
  return t;
}

c10::IValue to_neuron(const c10::IValue& v, const ViewMap& map) {
  if (v.isTensor()) return to_neuron(v.toTensor(), map);
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(to_neuron(t, map));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(to_neuron(e, map));
    return out;
  }
  return v;
}

namespace {

class NeuronWork : public c10d::Work {
 public:
  NeuronWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<ViewMap> map, std::shared_ptr<PostProcess> post)
      : c10d::Work(-1, inner->retrieveOpType()),
        inner_(std::move(inner)),
        map_(std::move(map)),
        post_(std::move(post)) {}

  bool isCompleted() override {
    if (!inner_->isCompleted()) return false;
    if (inner_->isSuccess()) post_->run();
    settle();
    return true;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override {
    auto r = inner_->result();
    for (auto& t : r) t = to_neuron(t, *map_);
    return r;
  }
  void synchronize() override {
    inner_->synchronize();
    post_->run();
    settle();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool ok = inner_->wait(timeout);
    if (ok) post_->run();
    settle();
    return ok;
  }
  void blockCurrentStream() override { wait(kNoTimeout); }
  void abort() override { inner_->abort(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

  // Completed in the caller's thread once the collective is done, as NCCL's future is
  // completed from the host's view when the collective is enqueued: callbacks added with
  // then() run in the thread that adds them, under its dispatch modes, autocast and grad
  // mode. Completed by gloo's thread instead, a DDP comm hook's callbacks (fp16
  // decompression, PowerSGD's matmuls and its own all-reduces) would run on that thread,
  // unseen by the caller's profilers and recorders.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(fut_mu_);
    if (!fut_) {
      auto inner_fut = inner_->getFuture();
      fut_ = c10::make_intrusive<c10::ivalue::Future>(inner_fut->elementType());
      try {
        wait(kNoTimeout);
        inner_fut->wait();
        fut_->markCompleted(to_neuron(inner_fut->value(), *map_));  // value() rethrows its error
      } catch (...) {
        fut_->setError(std::current_exception());
      }
    }
    return fut_;
  }

 private:
  // gloo's worker thread holds its work, and through it the CPU views that own the
  // tensors' memory, for a moment after marking it complete. Waiting for it to let go
  // frees the memory when the caller drops the tensors, as a device allocator that
  // orders frees by stream does, and not whenever that thread next runs: the peak
  // memory a run reports must not depend on thread scheduling. Bounded, so a holder
  // this does not know of costs a delay, never a hang.
  void settle() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (inner_.use_count() > 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<ViewMap> map_;
  std::shared_ptr<PostProcess> post_;
  std::mutex fut_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

// One Work over the works of a coalescing window.
class CoalescedWork : public c10d::Work {
 public:
  explicit CoalescedWork(std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : c10d::Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override {
    for (auto& w : works_)
      if (!w->isCompleted()) return false;
    return true;
  }
  bool isSuccess() const override {
    for (auto& w : works_)
      if (!w->isSuccess()) return false;
    return true;
  }
  std::exception_ptr exception() const override {
    for (auto& w : works_)
      if (auto e = w->exception()) return e;
    return nullptr;
  }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> out;
    for (auto& w : works_)
      for (auto& t : w->result()) out.push_back(t);
    return out;
  }
  void synchronize() override {
    for (auto& w : works_) w->synchronize();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    bool ok = true;
    for (auto& w : works_) ok = w->wait(timeout) && ok;
    return ok;
  }
  void abort() override {
    for (auto& w : works_) w->abort();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    c10::List<c10::intrusive_ptr<c10::ivalue::Future>> futs(
        c10::FutureType::create(c10::ListType::create(c10::TensorType::get())));
    for (auto& w : works_) futs.push_back(w->getFuture());
    auto all = c10::collectAll(futs);
    return all->then(
        [](c10::ivalue::Future& f) -> c10::IValue {
          c10::List<at::Tensor> out;
          for (const c10::IValue& v : f.value().toList()) {
            auto value = v.toFuture()->value();  // rethrows a collective's error
            if (value.isTensorList())
              for (const at::Tensor& t : value.toTensorList()) out.push_back(t);
          }
          return out;
        },
        c10::ListType::create(c10::TensorType::get()));
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

std::mutex g_coalesce_mu;
std::unordered_map<const c10d::ProcessGroup*, std::vector<c10::intrusive_ptr<c10d::Work>>> g_coalescing;

}  // namespace

c10::intrusive_ptr<c10d::Work> make_neuron_work(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<ViewMap> map,
                                                std::shared_ptr<PostProcess> post) {
  return c10::make_intrusive<NeuronWork>(std::move(inner), std::move(map), std::move(post));
}

void track_for_coalescing(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const c10::intrusive_ptr<c10d::Work>& w) {
  std::lock_guard<std::mutex> lock(g_coalesce_mu);
  if (g_coalescing.empty()) return;
  auto it = g_coalescing.find(pg.get());
  if (it != g_coalescing.end()) it->second.push_back(w);
}

void start_coalescing(const std::string& group_name) {
  auto pg = c10d::resolve_process_group(group_name);
  std::lock_guard<std::mutex> lock(g_coalesce_mu);
  // (a previous window left open by an exception in its body is dropped)
  g_coalescing[pg.get()].clear();
}

c10::intrusive_ptr<c10d::Work> end_coalescing(const std::string& group_name) {
  auto pg = c10d::resolve_process_group(group_name);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(g_coalesce_mu);
    auto it = g_coalescing.find(pg.get());
    TORCH_CHECK(it != g_coalescing.end(), "process group '", group_name, "' is not coalescing");
    works = std::move(it->second);
    g_coalescing.erase(it);
  }
  return c10::make_intrusive<CoalescedWork>(std::move(works));
}

}  // namespace neuron
