//! halyard-worker
