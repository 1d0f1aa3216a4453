"""broker: a node's gRPC front end: edge validation, leader check and redirect, the batcher, `main`."""
