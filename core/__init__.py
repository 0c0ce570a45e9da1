"""The ground floor: the user-error type and CLI plumbing, checkpoint I/O, metrics and W&B, device/dtype/seed set-up.
Imports only the standard library and third-party packages, nothing of posgpt's other packages."""
