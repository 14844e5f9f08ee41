//! The budget headers of an incoming request, decoded line by line.

use std::time::Duration;

use super::super::envoy::{self, EnvoyTimeoutError};
use super::super::grpc_timeout::{self, GrpcTimeoutError};
use super::super::rejection_cap::RejectionCap;
use super::super::service_budget::{ServiceBudget, ServiceBudgetError};
use super::super::stage::RequestClass;

/// One budget header, decoded line by line as the request's lines are added.
#[derive(Debug)]
pub(super) struct Field<E> {
    pub(super) lines: u32,
    /// The shortest valid value among the lines.
    pub(super) shortest: Option<Duration>,
    /// The first decoding error among the lines.
    pub(super) error: Option<E>,
}

impl<E> Field<E> {
    const fn new() -> Self {
        Field {
            lines: 0,
            shortest: None,
            error: None,
        }
    }

    fn add(&mut self, line: Result<Duration, E>) {
        self.lines = self.lines.saturating_add(1);
        match line {
            Ok(d) => self.shortest = Some(self.shortest.map_or(d, |s| s.min(d))),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }
}

/// The budget headers of an incoming request, for
/// [`EndpointPolicy::admit`](crate::wire::EndpointPolicy::admit).
///
/// Call a setter once per header line, with the raw bytes of the value; each line is decoded
/// as it is added (with the `tower` feature, `Incoming::from_headers` reads an
/// `http::HeaderMap`, and `Incoming::take_from` also removes the headers from it). A header
/// sent on more than one line is ambiguous (a smuggled second `grpc-timeout: 99999999H` behind
/// a proxy that read the first is exactly what an attacker would try) and counts as bad input;
/// if the policy falls back rather than rejects, the shortest valid line still counts, so a
/// repeat can never lengthen the budget, and the claims of a `service-budget` header (`op`,
/// `gen`, `prio`) count only when it came on one line and was valid.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::Incoming;
///
/// let incoming = Incoming::new()
///     .grpc_timeout(b"250m")
///     .service_budget(b"v=1, rem=240, op=checkout-7");
/// # let _ = incoming;
/// ```
#[derive(Debug)]
pub struct Incoming {
    pub(super) grpc_timeout: Field<GrpcTimeoutError>,
    pub(super) service_budget: Field<ServiceBudgetError>,
    pub(super) envoy: Field<EnvoyTimeoutError>,
    /// The first valid `service-budget` line (operation id, priority, generation).
    pub(super) caller: Option<ServiceBudget>,
    /// What the request does, as its server layer says (for staged enforcement).
    pub(super) class: RequestClass,
    /// The rejection cap the request's refusal counts in, if the endpoint has one.
    pub(super) cap: Option<RejectionCap>,
}

impl Incoming {
    /// The policy version (`pv`) of the caller's `service-budget`, if it came on one line
    /// and was valid (only then do its claims count).
    #[cfg_attr(not(feature = "rollout"), allow(dead_code))]
    pub(crate) fn claimed_policy_version(&self) -> Option<u32> {
        let unambiguous = self.service_budget.lines == 1 && self.service_budget.error.is_none();
        self.caller
            .as_ref()
            .filter(|_| unambiguous)
            .and_then(ServiceBudget::policy_version)
    }
}

impl Incoming {
    /// A request without budget headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new();
    /// # let _ = incoming;
    /// ```
    pub const fn new() -> Self {
        Incoming {
            grpc_timeout: Field::new(),
            service_budget: Field::new(),
            envoy: Field::new(),
            caller: None,
            class: RequestClass::SideEffecting,
            cap: None,
        }
    }

    /// The endpoint's [`RejectionCap`]: the request counts in its window, and a refusal of
    /// the budget rules beyond the cap becomes a shadow decision. Not a header: the server
    /// layer sets it ([`AdmitLayer::rejection_cap`](crate::integrations::tower::AdmitLayer::rejection_cap)).
    ///
    /// # Examples
    ///
    /// See [`RejectionCap`].
    pub fn rejection_cap(mut self, cap: &RejectionCap) -> Self {
        self.cap = Some(cap.clone());
        self
    }

    /// What the request does (see [`RequestClass`]): what staged enforcement
    /// ([`EndpointPolicyBuilder::enforce_for`](crate::wire::EndpointPolicyBuilder::enforce_for)) goes by.
    /// Not a header: the server layer sets it from the request's method.
    ///
    /// # Examples
    ///
    /// See [`RequestClass`].
    pub const fn class(mut self, class: RequestClass) -> Self {
        self.class = class;
        self
    }

    /// Adds a `grpc-timeout` header line.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new().grpc_timeout(b"1S");
    /// # let _ = incoming;
    /// ```
    pub fn grpc_timeout(mut self, value: &[u8]) -> Self {
        self.grpc_timeout.add(grpc_timeout::decode_bytes(value));
        self
    }

    /// Adds a `service-budget` header line.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=100");
    /// # let _ = incoming;
    /// ```
    pub fn service_budget(mut self, value: &[u8]) -> Self {
        let parsed = ServiceBudget::parse(value).map(|b| {
            let rem = b.remaining();
            self.caller.get_or_insert(b);
            rem
        });
        self.service_budget.add(parsed);
        self
    }

    /// Adds an `x-envoy-expected-rq-timeout-ms` header line (it counts only when the policy
    /// [reads it](crate::wire::EndpointPolicyBuilder::envoy_timeout); it is kept for audit in any
    /// case).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new().envoy_expected_timeout(b"15000");
    /// # let _ = incoming;
    /// ```
    pub fn envoy_expected_timeout(mut self, value: &[u8]) -> Self {
        self.envoy.add(envoy::decode_expected_timeout_bytes(value));
        self
    }
}

impl Default for Incoming {
    fn default() -> Self {
        Incoming::new()
    }
}

/// The budget headers, as `http` names them.
#[cfg(feature = "tower")]
mod names {
    use http::HeaderName;

    use super::super::super::{envoy, grpc_timeout, service_budget};

    pub(super) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(grpc_timeout::HEADER);
    pub(super) const SERVICE_BUDGET: HeaderName = HeaderName::from_static(service_budget::HEADER);
    pub(super) const ENVOY: HeaderName = HeaderName::from_static(envoy::EXPECTED_RQ_TIMEOUT_MS);
}

#[cfg(feature = "tower")]
impl Incoming {
    /// The budget headers of a request (`grpc-timeout`, `service-budget`,
    /// `x-envoy-expected-rq-timeout-ms`), every line of each, in order. This is the scan the
    /// tower layer ([`Admit`](crate::integrations::tower::Admit)) makes. Feature `tower`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use http::{HeaderMap, HeaderValue};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.append("grpc-timeout", HeaderValue::from_static("1S"));
    /// headers.append("grpc-timeout", HeaderValue::from_static("99999999H")); // smuggled
    /// let policy = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// let err = policy.admit(Incoming::from_headers(&headers), tokio::time::Instant::now());
    /// assert!(err.unwrap_err().is_invalid()); // a repeated budget header is ambiguous
    /// # }
    /// ```
    pub fn from_headers(headers: &http::HeaderMap) -> Self {
        let mut inc = Incoming::new();
        for v in headers.get_all(names::GRPC_TIMEOUT) {
            inc = inc.grpc_timeout(v.as_bytes());
        }
        for v in headers.get_all(names::SERVICE_BUDGET) {
            inc = inc.service_budget(v.as_bytes());
        }
        for v in headers.get_all(names::ENVOY) {
            inc = inc.envoy_expected_timeout(v.as_bytes());
        }
        inc
    }

    /// [`from_headers`](Self::from_headers), and removes every line of the three budget
    /// headers from `headers`, as the tower layer does before its handler sees the request:
    /// what they said is in the [`Admission`](super::Admission), and a handler that copies its
    /// incoming headers onto an outgoing call cannot pass a caller's budget, priority,
    /// operation id or generation on. Feature `tower`.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use cancel_scope::wire::Incoming;
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("service-budget", HeaderValue::from_static("v=1, rem=86400000, prio=0"));
    /// headers.insert("x-request-id", HeaderValue::from_static("7"));
    /// let incoming = Incoming::take_from(&mut headers);
    /// assert!(!headers.contains_key("service-budget"));
    /// assert!(headers.contains_key("x-request-id"));
    /// # let _ = incoming;
    /// ```
    pub fn take_from(headers: &mut http::HeaderMap) -> Self {
        let inc = Incoming::from_headers(headers);
        // Only the headers that are there: a request without them pays no second lookup.
        if inc.grpc_timeout.lines > 0 {
            headers.remove(names::GRPC_TIMEOUT);
        }
        if inc.service_budget.lines > 0 {
            headers.remove(names::SERVICE_BUDGET);
        }
        if inc.envoy.lines > 0 {
            headers.remove(names::ENVOY);
        }
        inc
    }
}
