"""torch.profiler and memory-snapshot support of the ``neuron`` device (private helpers).

Users profile with ``torch.profiler`` (``ProfilerActivity.PrivateUse1``) and
record memory with ``torch.neuron.memory._record_memory_history``; this
package holds the glue the device's own code calls.
"""
