"""chaos: fault-injection scenarios against real local clusters, and the process control they share."""
