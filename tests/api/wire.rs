//! Pins the auto traits of the wire types: policies, what they read and what they yield.

use cancel_scope::wire::{EgressPolicy, EndpointPolicy, Incoming, OperationSource};

#[test]
fn auto_traits() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    send_sync::<EndpointPolicy>();
    send_sync::<EgressPolicy>();
    send_sync::<Incoming>();
    send_sync::<cancel_scope::wire::Admission>();
    send_sync::<OperationSource>();
    send_sync::<cancel_scope::wire::Operation>();
    send_sync::<cancel_scope::wire::Outgoing>();
    error::<cancel_scope::wire::AdmissionError>();
    error::<cancel_scope::wire::PolicyError>();
    #[cfg(feature = "rollout")]
    {
        fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
        send_sync::<cancel_scope::wire::PolicyHandle>();
        unwind_safe::<cancel_scope::wire::PolicyHandle>();
    }
}
