//! halyard-coordinator
