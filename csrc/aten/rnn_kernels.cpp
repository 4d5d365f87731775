// The fused RNN cell kernels. PyTorch's LSTM/GRU cells call them on every
// device except CPU (CPU runs a decomposition); only CUDA has them upstream.
// They compute what CPU's decomposition computes, in its order (bias added to
// each half before the halves are summed), and save the workspace CUDA saves,
// so autograd's formulas for these ops apply unchanged.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace neuron {
namespace {

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates.add(*bias) : gates;
}

void check_cell(const char* op, const at::Tensor& in, const at::Tensor& hid, const at::Tensor& state, int64_t ngates) {
  TORCH_CHECK(in.dim() == 2 && in.sizes() == hid.sizes(), op,
              ": expected input_gates and hidden_gates of one 2-D shape, got ", in.sizes(), " and ", hid.sizes());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == in.size(0) && state.size(1) * ngates == in.size(1), op,
              ": expected a state of shape [", in.size(0), ", ", in.size(1) / ngates, "], got ", state.sizes());
}

// Workspace: the activated gates [i, f, g, o], as CUDA saves them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4);
  auto gates = with_bias(input_gates, input_bias).add(with_bias(hidden_gates, hidden_bias));
  auto chunks = gates.chunk(4, 1);
  auto i = chunks[0].sigmoid();
  auto f = chunks[1].sigmoid();
  auto g = chunks[2].tanh();
  auto o = chunks[3].sigmoid();
  auto cy = f.mul(cx).add_(i.mul(g));
  auto hy = o.mul(cy.tanh());
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward_impl(const std::optional<at::Tensor>& grad_hy,
                                                                             const std::optional<at::Tensor>& grad_cy,
                                                                             const at::Tensor& cx, const at::Tensor& cy,
                                                                             const at::Tensor& workspace,
                                                                             bool has_bias) {
  const bool has_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_cy = grad_cy.has_value() && grad_cy->defined();
  if (!has_hy && !has_cy) return {at::Tensor(), at::Tensor(), at::Tensor()};
  auto w = workspace.chunk(4, 1);
  const auto &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  auto tanh_cy = cy.tanh();
  // d(loss)/d(cy), through hy = o * tanh(cy) and directly.
  at::Tensor gc = has_hy ? grad_hy->mul(o).mul_(tanh_cy.mul(tanh_cy).neg_().add_(1)) : at::zeros_like(cy);
  if (has_cy) gc.add_(*grad_cy);
  at::Tensor go = has_hy ? grad_hy->mul(tanh_cy).mul_(o).mul_(o.neg().add_(1)) : at::zeros_like(o);
  auto gi = gc.mul(g).mul_(i).mul_(i.neg().add_(1));
  auto gf = gc.mul(cx).mul_(f).mul_(f.neg().add_(1));
  auto gg = gc.mul(i).mul_(g.mul(g).neg_().add_(1));
  auto grad_gates = at::cat({gi, gf, gg, go}, 1);
  auto grad_cx = gc.mul(f);
  auto grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

// Workspace: [r, z, n, hidden n-gate (with bias), hx], as CUDA saves it.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3);
  auto ig = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hg = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  auto r = hg[0].add(ig[0]).sigmoid_();
  auto z = hg[1].add(ig[1]).sigmoid_();
  auto n = ig[2].add(hg[2].mul(r)).tanh_();
  auto hy = hx.sub(n).mul_(z).add_(n);
  return {hy, at::cat({r, z, n, hg[2], hx}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  const auto &r = w[0], &z = w[1], &n = w[2], &hn = w[3], &hx = w[4];
  auto gz = grad_hy.mul(hx.sub(n)).mul_(z).mul_(z.neg().add_(1));
  auto grad_hx = grad_hy.mul(z);
  auto gn = grad_hy.mul(z.neg().add_(1)).mul_(n.mul(n).neg_().add_(1));
  auto ghn = gn.mul(r);
  auto gr = gn.mul(hn).mul_(r).mul_(r.neg().add_(1));
  auto grad_input_gates = at::cat({gr, gz, gn}, 1);
  auto grad_hidden_gates = at::cat({gr, gz, ghn}, 1);
  at::Tensor gib, ghb;
  if (has_bias) {
    gib = grad_input_gates.sum(0);
    ghb = grad_hidden_gates.sum(0);
  }
  return {grad_input_gates, grad_hidden_gates, grad_hx, gib, ghb};
}

}  // namespace
}  // namespace neuron

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(neuron::fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(neuron::fused_lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(neuron::fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(neuron::fused_gru_cell_backward));
}
