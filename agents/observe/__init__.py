"""What both processes use to observe a run: Prometheus metrics, the Chrome trace, the state log, logging."""
