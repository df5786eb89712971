//! halyard-pipelines
