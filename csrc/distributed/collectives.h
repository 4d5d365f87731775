// c10d collectives on neuron tensors: zero-copy CPU views, run by the process
// group's CPU backend (gloo).
#pragma once

namespace neuron {

// Replaces the PrivateUse1 kernels of all c10d ops that have one; returns how
// many (idempotent).
int register_collective_routes();

}  // namespace neuron
