//! Workloads: trace formats, trace analysis and synthesis, and the benchmark client.
