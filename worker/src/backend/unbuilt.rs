//! Stand-ins for the backends of features this build left out (`gguf`, `embed`): a plan
//! with one of their models is refused at start, and a job naming them is refused.

use futures::future::BoxFuture;
use halyard_proto::pool::WorkerModel;
use halyard_proto::{Completion, Job};

use super::{Backend, BackendKind, CallError, Load};

/// `backend = "gguf"` in a build without the `gguf` feature.
#[cfg(not(feature = "gguf"))]
pub const GGUF: BackendKind = BackendKind {
    name: "gguf",
    http: false,
    load: |l: &Load<'_>| {
        match l.models("gguf").next() {
        Some((_, WorkerModel::Gguf(s))) => Err(format!(
            "model {} needs the `gguf` backend, but this halyard was built without the `gguf` feature",
            s.path.display()
        )),
        _ => Ok(Box::new(Unbuilt("this halyard was built without the `gguf` feature"))),
    }
    },
};

/// `backend = "embed"` in a build without the `embed` feature.
#[cfg(not(feature = "embed"))]
pub const EMBED: BackendKind = BackendKind {
    name: "embed",
    http: false,
    load: |l: &Load<'_>| {
        match l.models("embed").next() {
        Some((_, WorkerModel::Embed(s))) => Err(format!(
            "embedding model {} needs the `embed` backend, but this halyard was built without the `embed` feature (cargo build --release -p halyard)",
            s.path.display()
        )),
        _ => Ok(Box::new(Unbuilt(
            "this halyard was built without the `embed` feature (backend = \"embed\")",
        ))),
    }
    },
};

/// Refuses every call, saying which feature is missing.
struct Unbuilt(&'static str);

impl Backend for Unbuilt {
    fn call<'a>(&'a self, _job: &'a Job) -> BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(std::future::ready(Err(CallError::permanent(self.0))))
    }
}
