//! First contact (issue 48): an endpoint that has never answered this worker is checked,
//! not waited out.
//!
//! A refused key (HTTP 401/403), a 404 (a wrong route in `base_url`, or a model name the
//! server does not know) or a 200 whose body is not a chat completion (`base_url` points
//! at a web page, say) is each job's permanent or transient failure once the endpoint
//! has served this worker. Before that, it is the endpoint's: every job of the pool
//! would fail the same way and end as a dead letter (or, for a body of the wrong shape,
//! be retried until it does). So while [`Machine::has_answered`] is false such a failure
//! pauses the pool like an outage, with its own [`OutageReason`]
//! ([`OutageReason::first_contact_only`]): no job is dead-lettered for it, the pool
//! probes as in any outage, and the pool-health record tells the coordinator, which
//! stops a run whose pool has no result after `[run] first_contact_s` and names the fix
//! (`halyard_coordinator`'s `run::outage`).
//!
//! [`Machine::has_answered`]: super::Machine::has_answered

use halyard_proto::OutageReason;

use crate::call_error::{CallError, ErrorClass};

/// The first-contact reason of a failed call, if it has one.
pub fn reason(e: &CallError) -> Option<OutageReason> {
    if e.outage().is_some() {
        return None;
    }
    match e.status {
        Some(401 | 403) => Some(OutageReason::Unauthorized),
        Some(404) => Some(OutageReason::NotFound),
        // A 200 the decoder could not read as a chat completion (a null content with a
        // finish reason is the model's answer, permanent, and not counted here).
        Some(200) if e.class == ErrorClass::Transient => Some(OutageReason::NotApi),
        _ => None,
    }
}

/// `e` as an endpoint-wide failure when it is a first-contact one.
pub fn upgrade(e: CallError) -> CallError {
    match reason(&e) {
        Some(r) => CallError { class: ErrorClass::Unavailable(r), ..e },
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, class: ErrorClass) -> CallError {
        CallError { class, status: Some(code), message: format!("HTTP {code}"), retry_after: None }
    }

    /// 401/403, 404 and a 200 that is not a completion are first-contact failures; a
    /// bad request, a rate limit, a refusal without content and outages are not.
    #[test]
    fn which_failures_count() {
        use ErrorClass::*;
        assert_eq!(reason(&status(401, Permanent)), Some(OutageReason::Unauthorized));
        assert_eq!(reason(&status(403, Permanent)), Some(OutageReason::Unauthorized));
        assert_eq!(reason(&status(404, Permanent)), Some(OutageReason::NotFound));
        assert_eq!(reason(&status(200, Transient)), Some(OutageReason::NotApi));
        assert_eq!(reason(&status(200, Permanent)), None);
        assert_eq!(reason(&status(400, Permanent)), None);
        assert_eq!(reason(&status(429, RateLimited)), None);
        assert_eq!(reason(&status(503, Unavailable(OutageReason::Unavailable))), None);
        assert_eq!(reason(&CallError::permanent("no key")), None);
        let up = upgrade(status(401, Permanent));
        assert_eq!(up.outage(), Some(OutageReason::Unauthorized));
        assert_eq!(up.status, Some(401));
    }
}
