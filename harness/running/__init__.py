"""Running the checks: workers and their GPUs, the controller, isolation, scheduling, device memory
(the estimate, the ledger, the card, real or simulated, the memory watch), the run's state and
records, progress, and whose fault an error is (attribution)."""
