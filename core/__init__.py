"""The ground floor: the user-error type and CLI plumbing, declared numeric domains, checkpoint I/O, atomic writes and
the run-directory lock, metrics and W&B, device, dtype, threads, seed and peak FLOP/s.
Imports only the standard library and third-party packages, nothing of posgpt's other packages."""
